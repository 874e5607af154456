"""Post-training on Ray: vLLM rollout engines, one scheduler for rollout and verification work, a Ray Train
learner, and the driver that runs GRPO over them synchronously or one step off-policy."""
