"""Config -> builder -> running thing: the Serve application that hosts both tiers behind one ingress.

``build_serving_app`` wires one ``LLMServer`` deployment per tier (Ray Serve LLM's public
``build_llm_deployment``) behind an ingress class, by default Ray's own ``OpenAiIngress``; the gateway
passes its subclass. Keeping the ingress a parameter is what lets the gateway benchmark measure its own
overhead against the bare ingress on the same application.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infra.registry import Registry
from serving.tiers import ResolvedTier, TierConfig, resolve_tier, to_llm_config

# The OpenAI routes the ingress serves (Ray's own table also has audio, score and embeddings routes,
# which a text-generation gateway does not offer).
OPENAI_ROUTES: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "models": lambda app: app.get("/v1/models"),
    "model_data": lambda app: app.get("/v1/models/{model:path}"),
    "completions": lambda app: app.post("/v1/completions"),
    "chat": lambda app: app.post("/v1/chat/completions"),
}


def resolve_tiers(tiers: Sequence[TierConfig], registry: Registry) -> list[ResolvedTier]:
    return [resolve_tier(tier, registry) for tier in tiers]


def build_serving_app(
    resolved: Sequence[ResolvedTier],
    *,
    ingress_cls: type | None = None,
    routes: dict[str, Callable[[Any], Callable[..., Any]]] | None = None,
    fastapi_app: Any = None,
    ingress_kwargs: dict[str, Any] | None = None,
    ingress_options: dict[str, Any] | None = None,
) -> Any:
    """A Serve ``Application``: one LLMServer deployment per tier behind ``ingress_cls``."""
    from ray import serve
    from ray.serve.llm import build_llm_deployment
    from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress

    ingress: Any = ingress_cls or OpenAiIngress
    configs = [to_llm_config(tier) for tier in resolved]
    deployments = {config.model_id: build_llm_deployment(config) for config in configs}
    cards = {config.model_id: model_card(config) for config in configs}
    options = ingress.get_deployment_options(configs)
    options.update(ingress_options or {})
    if "num_replicas" in (ingress_options or {}):
        options.pop("autoscaling_config", None)  # Serve takes one or the other
    deployment_cls = make_fastapi_ingress(ingress, endpoint_map=routes or OPENAI_ROUTES, app=fastapi_app)
    deployment: Any = serve.deployment(deployment_cls, **options)
    return deployment.bind(llm_deployments=deployments, model_cards=cards, **(ingress_kwargs or {}))


def model_card(llm_config: Any) -> Any:
    """The OpenAI ``/v1/models`` entry Ray Serve LLM derives from an LLMConfig."""
    # Ray exposes this helper only from its internal module; it is what build_openai_app itself uses.
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata

    return to_model_metadata(llm_config.model_id, llm_config)
