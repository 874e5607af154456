"""The gateway ingress: Ray Serve LLM's public ``OpenAiIngress`` plus Tandem's routing and headers.

It maps public model ids and aliases to tiers, rewrites the request's model to the tier's canonical id
before delegating, stamps ``x-tandem-tier`` / ``x-tandem-version`` on every response, and adds ``/health``
and a Prometheus ``/metrics`` that re-exports Ray's metrics (engine metrics appear as ``ray_vllm_*``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from fastapi import FastAPI, Request
from pydantic import BaseModel
from ray.serve.llm.ingress import OpenAiIngress
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from gateway.bounds import BodySizeLimit
from gateway.canary import candidate_app_name, candidate_model_id, deployment_name
from gateway.errors import install_error_handlers
from gateway.pipeline import RequestPipeline, TierTarget
from gateway.policy import GatewayPolicy

log = logging.getLogger(__name__)


class TierRoute(BaseModel):
    """What the ingress knows about one tier: its public names and the release it serves."""

    name: str
    model_id: str
    aliases: list[str] = []
    version: str = ""
    release: str = "stable"


def create_fastapi_app(policy: GatewayPolicy | None = None) -> FastAPI:
    """The FastAPI app behind the ingress: OpenAI-format errors and the request body size limit."""
    policy = policy or GatewayPolicy()
    app = FastAPI(
        title="Tandem gateway",
        description="OpenAI-compatible API over a standard and a speculative fast tier.",
        version="0.1.0",
    )
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=policy.bounds.max_body_bytes)
    return app


class TandemIngress(OpenAiIngress):
    """OpenAiIngress with Tandem's request pipeline (bounds, keys, limits, routing, guardrails, telemetry),
    tier/version headers, health and metrics."""

    def __init__(
        self,
        llm_deployments: dict[str, Any],
        model_cards: dict[str, Any],
        *,
        tiers: list[dict[str, Any]] | None = None,
        policy: dict[str, Any] | None = None,
        host: str = "127.0.0.1",
        weights_file: str | None = None,
        late_candidates: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(llm_deployments, model_cards, **kwargs)
        routes = [TierRoute.model_validate(t) for t in tiers or []] or [
            TierRoute(name="standard", model_id=model_id) for model_id in model_cards
        ]
        self._routes = {route.model_id: route for route in routes}
        targets = [TierTarget(r.name, r.model_id, tuple(r.aliases), r.version, r.release) for r in routes]
        self._pipeline = RequestPipeline(
            GatewayPolicy.model_validate(policy or {}),
            targets,
            host=host,
            weights_file=weights_file,
            late_candidates=late_candidates,
        )
        self._http = httpx.AsyncClient(timeout=5.0)

    # The public request models subclass Ray's internal ones; FastAPI parses the body from these hints.
    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:  # type: ignore[override]
        return await self._pipeline.handle(body, request, super().chat, "chat")

    async def completions(self, body: CompletionRequest, request: Request) -> Response:  # type: ignore[override]
        return await self._pipeline.handle(body, request, super().completions, "text_completion")

    # -- candidates deployed after start (canary.late_candidates) ------------------------------------
    async def _get_model_id(self, model: str | None) -> str:
        if model is not None and model not in self._model_cards:
            self._bind_late_candidate(model)
        return await super()._get_model_id(model)

    def _bind_late_candidate(self, model_id: str) -> bool:
        """Reach a late candidate tier's engine, in its own Serve application, by deployment handle.

        Ray's ingress only knows the engines bound into its application at build time; a handle looked up by
        name is the public way to call one deployed since (Serve resolves it while the application exists).
        """
        pipeline = self._pipeline
        tier = pipeline.names.get(model_id)
        if not pipeline.late_candidates or tier is None or pipeline.pinned.get(model_id) != "candidate":
            return False
        if model_id not in self._default_serve_handles:
            from ray import serve

            application = candidate_app_name(serve.get_replica_context().app_name, tier)
            stable_id = pipeline.targets[tier].model_id
            self._default_serve_handles[model_id] = serve.get_deployment_handle(
                deployment_name(model_id), app_name=application
            )
            self._model_cards[model_id] = self._model_cards[stable_id].model_copy(update={"id": model_id})
            log.info("event=late_candidate_bound model=%s application=%s", model_id, application)
        target = pipeline.late_candidate(tier)
        self._routes[model_id] = TierRoute(
            name=tier, model_id=model_id, version=target.version, release="candidate"
        )
        return True

    async def model_data(self, model: str) -> Any:
        tier = self._pipeline.requested_tier(model)
        if model in self._routes:
            return await super().model_data(model)
        stable = {r.name: r for r in self._routes.values() if r.release == "stable"}
        return await super().model_data(stable[tier if tier in stable else "standard"].model_id)

    # -- operations ---------------------------------------------------------------------------------
    async def health(self) -> Response:
        """200 when every tier of a release with traffic answers its health check, else 503 naming the failing
        tiers. A release at weight 0 may be an empty slot (a candidate not yet deployed, a removed stable)."""
        weights = self._pipeline.splitter.weights()
        live = {"stable": weights.stable > 0, "candidate": weights.candidate > 0}
        if live["candidate"] and self._pipeline.late_candidates:
            for target in self._pipeline.targets.values():
                self._bind_late_candidate(candidate_model_id(target.model_id))
        routes = {model_id: r for model_id, r in self._routes.items() if live.get(r.release, True)}

        async def check(model_id: str) -> str | None:
            try:
                await asyncio.wait_for(self._default_serve_handles[model_id].check_health.remote(), 10)
            except Exception as exc:  # any failure, including a timeout, means unhealthy
                return f"{type(exc).__name__}: {exc}"[:300]
            return None

        results = await asyncio.gather(*(check(model_id) for model_id in routes))
        tiers = {
            _tier_label(routes[model_id]): {
                "model": model_id,
                "version": routes[model_id].version,
                "ok": error is None,
            }
            | ({"error": error} if error else {})
            for model_id, error in zip(routes, results, strict=True)
        }
        healthy = all(error is None for error in results)
        return JSONResponse(
            {"status": "ok" if healthy else "degraded", "tiers": tiers}, 200 if healthy else 503
        )

    async def metrics(self) -> Response:
        """Prometheus text: Ray's metrics for this node (ingress, Serve, and the engines' ``ray_vllm_*``)."""
        url = await asyncio.to_thread(_ray_metrics_url)
        if url is None:
            return PlainTextResponse("# Ray metrics export is not enabled on this node\n", status_code=503)
        upstream = await self._http.get(url)
        return PlainTextResponse(upstream.text, media_type="text/plain; version=0.0.4")


def _tier_label(route: TierRoute) -> str:
    return route.name if route.release == "stable" else f"{route.name}@{route.release}"


def _ray_metrics_url() -> str | None:
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("MetricsExportPort"):
            return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    return None


GATEWAY_ROUTES = {
    "models": lambda app: app.get("/v1/models"),
    "model_data": lambda app: app.get("/v1/models/{model:path}"),
    "completions": lambda app: app.post("/v1/completions"),
    "chat": lambda app: app.post("/v1/chat/completions"),
    "health": lambda app: app.get("/health"),
    "metrics": lambda app: app.get("/metrics"),
}
