"""Candidate tiers deployed after the gateway started, as their own Serve applications (one per tier).

``tandem serve`` with ``canary.late_candidates`` leaves its own application alone; the rollout deployer
(:class:`release.serve_deployer.ServeDeployer`) calls :func:`deploy` / :func:`remove` as a short-lived Ray driver,
or runs ``python -m gateway.candidate_apps deploy|remove`` in a child process when it is already a driver of
some cluster, so the two connections never mix.
The gateway's ingress reaches these engines by deployment handle (``TandemIngress._bind_late_candidate``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gateway.app import build_candidate_apps, candidate_tiers
from gateway.canary import candidate_app_name
from gateway.config import TandemConfig, load_config
from infra.errors import TandemError
from infra.lifecycle import init_ray
from infra.registry import open_registry
from serving.tiers import resolve_tier

log = logging.getLogger(__name__)


def with_candidate(config: TandemConfig, model: str, draft: str | None) -> TandemConfig:
    """The gateway config as if it had been started with this candidate (for its tiers' settings)."""
    canary = config.canary.model_copy(update={"model": model, "draft": draft, "late_candidates": False})
    return config.model_copy(update={"canary": canary})


def application_names(config: TandemConfig, app_name: str) -> list[str]:
    """The Serve applications a late candidate of this gateway occupies, one per stable tier."""
    return [candidate_app_name(app_name, tier.name) for tier in config.tiers]


def deploy(config: TandemConfig, model: str, draft: str | None, app_name: str) -> list[str]:
    """Resolve the candidate's tiers from the registry and run them; returns once every one is RUNNING."""
    from ray import serve

    candidate = with_candidate(config, model, draft)
    registry = open_registry(candidate.registry)
    resolved = [resolve_tier(tier, registry) for tier in candidate_tiers(candidate)]
    names = []
    for tier, application in build_candidate_apps(resolved).items():
        name = candidate_app_name(app_name, tier)
        log.info("event=candidate_app_deploy application=%s model=%s", name, model)
        # No route prefix: only the gateway's ingress calls these engines, by handle.
        serve.run(application, name=name, route_prefix=None)
        names.append(name)
    return names


def remove(config: TandemConfig, app_name: str) -> list[str]:
    """Delete the candidate's applications (Serve drains their in-flight requests first)."""
    from ray import serve

    present = set(serve.status().applications)
    names = [name for name in application_names(config, app_name) if name in present]
    for name in names:
        log.info("event=candidate_app_delete application=%s", name)
        serve.delete(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.candidate_apps",
        description="Deploy or remove a late candidate's tiers beside a running Tandem gateway.",
    )
    parser.add_argument("action", choices=("deploy", "remove"))
    parser.add_argument("--gateway-config", type=Path, required=True, help="The running gateway's YAML.")
    parser.add_argument("--app-name", default="tandem", help="The gateway's Serve application.")
    parser.add_argument("--model", help="Candidate weights (registry ref); deploy only.")
    parser.add_argument("--draft", help="Candidate fast-tier draft (registry ref).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    try:
        config = load_config(args.gateway_config)
        init_ray(address=config.ray.address or "auto", log_to_driver=False)
        if args.action == "deploy":
            if not args.model:
                parser.error("deploy needs --model")
            names = deploy(config, args.model, args.draft, args.app_name)
        else:
            names = remove(config, args.app_name)
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(" ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
