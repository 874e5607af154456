"""Builds the full Serve application: both tiers behind the Tandem ingress."""

from __future__ import annotations

import logging
from typing import Any

from gateway.canary import CANDIDATE_SUFFIX, candidate_model_id
from gateway.config import TandemConfig
from gateway.ingress import GATEWAY_ROUTES, TandemIngress, TierRoute, create_fastapi_app
from infra.bundled import BUNDLED_REF, publish_bundled_model
from infra.registry import Registry, open_registry, registry_step
from serving.app import build_serving_app
from serving.tiers import ResolvedTier, TierConfig, resolve_tier

log = logging.getLogger(__name__)


def candidate_tiers(config: TandemConfig) -> list[TierConfig]:
    """The candidate release's tiers: the stable tiers' settings with the candidate's weights and draft."""
    if not config.canary.model:
        return []
    tiers = []
    for tier in config.tiers:
        update: dict[str, object] = {
            "model_id": candidate_model_id(tier.model_id),
            "aliases": [],
            "model": config.canary.model,
        }
        if tier.speculative is not None:
            spec = tier.speculative.model_copy(
                update={
                    "draft": config.canary.draft,
                    "method": "draft_model" if config.canary.draft else "auto",
                }
            )
            update["speculative"] = spec
        tiers.append(tier.model_copy(update=update))
    return tiers


def prepare_release(config: TandemConfig, registry: Registry | None = None) -> list[ResolvedTier]:
    """Resolve every tier (stable, then candidate) to verified local files; the bundled model is prepared
    on first use."""
    registry = registry or open_registry(config.registry)
    tiers = [*config.tiers, *candidate_tiers(config)]
    if any(tier.model == BUNDLED_REF for tier in tiers):
        with registry_step(f"preparing the bundled model {BUNDLED_REF} in the registry"):
            publish_bundled_model(registry)
    return [resolve_tier(tier, registry) for tier in tiers]


def tier_routes(resolved: list[ResolvedTier]) -> list[TierRoute]:
    return [
        TierRoute(
            name=r.config.name,
            model_id=r.config.model_id,
            aliases=r.config.aliases,
            version=r.version,
            release="candidate" if r.config.model_id.endswith(CANDIDATE_SUFFIX) else "stable",
        )
        for r in resolved
    ]


def build_gateway_app(config: TandemConfig, resolved: list[ResolvedTier]) -> Any:
    """The Serve application: one LLMServer per tier behind ``TandemIngress``."""
    return build_serving_app(
        resolved,
        ingress_cls=TandemIngress,
        routes=GATEWAY_ROUTES,
        fastapi_app=create_fastapi_app(config.gateway),
        ingress_kwargs={
            "tiers": [route.model_dump() for route in tier_routes(resolved)],
            "policy": config.gateway.model_dump(mode="json"),
            "host": config.server.host,
            "weights_file": str(config.canary.weights_file.resolve()),
            "late_candidates": config.canary.late_candidates,
        },
        ingress_options={
            "num_replicas": config.server.ingress_replicas,
            "graceful_shutdown_timeout_s": config.server.shutdown_grace_s,
        },
    )


def build_candidate_apps(resolved: list[ResolvedTier]) -> dict[str, Any]:
    """A candidate's tiers as stand-alone Serve applications, keyed by tier name: one LLMServer each, which
    the gateway's ingress reaches by deployment handle (``late_candidates``)."""
    from ray.serve.llm import build_llm_deployment

    from serving.tiers import to_llm_config

    return {r.config.name: build_llm_deployment(to_llm_config(r)) for r in resolved}
