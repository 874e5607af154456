"""Release orchestration above every stage: the `tandem release` pipeline, the canary rollout controller
and its adapters, the rollout config, and the cluster manifests. Nothing below imports it."""
