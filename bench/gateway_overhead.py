"""`tandem bench gateway`: what the Tandem ingress adds over Ray Serve LLM's bare ``OpenAiIngress``.

One Serve cluster, one cheap engine (a tiny random Llama, 1 output token), two ingresses in front of the
*same* LLMServer deployment: the bare ``OpenAiIngress`` at ``/bare`` and ``TandemIngress`` at ``/``. Load
alternates between them in rounds at the same concurrency, so the difference is the gateway's own cost.

Three views, because at 64 concurrency on a 2-core machine queueing noise (tens of ms) hides a 1 ms cost:
- loaded: p50/p99/RPS at ``concurrency`` (what a client sees under load);
- serial: one request at a time, alternating ingresses request by request (added latency without queues);
- in process: ``RequestPipeline.handle`` around an instant engine call, timed with ``perf_counter``
  (the pipeline's own CPU cost per request, the floor of what it can add).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.tiers import _percentile
from infra.lifecycle import init_ray


async def _load(url: str, model: str, requests: int, concurrency: int) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    remaining = requests
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                try:
                    response = await client.post(url, json=body)
                    status = response.status_code
                except httpx.HTTPError:
                    status = 599
                latencies.append(time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {
        "requests": requests,
        "wall_s": round(wall, 3),
        "rps": round(requests / wall, 1),
        "p50_ms": round(1000 * _percentile(latencies, 0.5), 2),
        "p99_ms": round(1000 * _percentile(latencies, 0.99), 2),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


async def _serial(targets: dict[str, str], model: str, requests: int) -> dict[str, dict[str, float]]:
    """One request at a time, the ingresses interleaved request by request so drift hits both equally."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    latencies: dict[str, list[float]] = {name: [] for name in targets}
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(requests):
            for name, url in targets.items():
                started = time.perf_counter()
                response = await client.post(url, json=body)
                elapsed = time.perf_counter() - started
                if response.status_code == 200:
                    latencies[name].append(elapsed)
    return {
        name: {
            "n": len(values),
            "p50_ms": round(1000 * _percentile(values, 0.5), 2),
            "p99_ms": round(1000 * _percentile(values, 0.99), 2),
        }
        for name, values in latencies.items()
    }


def measure_pipeline_cost(requests: int = 2000, *, stream: bool = False) -> dict[str, float]:
    """Per-request wall time of ``RequestPipeline.handle`` around an engine call that answers instantly."""
    from ray.serve.llm.openai_api_models import ChatCompletionRequest
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse

    from gateway.pipeline import RequestPipeline, TierTarget
    from gateway.policy import GatewayPolicy

    pipeline = RequestPipeline(
        GatewayPolicy(), [TierTarget("standard", "tandem-standard", ("standard",), "base")]
    )
    completion = {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "tandem-standard",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    chunks = [
        'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":'
        '[{"index":0,"delta":{"content":"ok"},"finish_reason":null}]}\n\n',
        'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[],'
        '"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n\n',
        "data: [DONE]\n\n",
    ]

    async def instant_engine(body: Any, request: Any) -> Response:
        if stream:

            async def pieces() -> Any:
                for piece in chunks:
                    yield piece

            return StreamingResponse(pieces(), media_type="text/event-stream")
        return JSONResponse(completion)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1234),
    }
    payload = {"model": "tandem-standard", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    if stream:
        payload["stream"] = True

    async def run() -> list[float]:
        timings: list[float] = []
        for index in range(requests + 200):
            started = time.perf_counter()
            body = ChatCompletionRequest.model_validate(payload)
            response = await pipeline.handle(body, Request(scope), instant_engine, "chat")
            if isinstance(response, StreamingResponse):
                async for _ in response.body_iterator:
                    pass
            if index >= 200:  # the first requests warm imports and caches
                timings.append(time.perf_counter() - started)
        return timings

    timings = asyncio.run(run())
    return {
        "requests": requests,
        "p50_ms": round(1000 * _percentile(timings, 0.5), 3),
        "p99_ms": round(1000 * _percentile(timings, 0.99), 3),
    }


def run_gateway_overhead_bench(
    *,
    requests: int = 1000,
    concurrency: int = 64,
    rounds: int = 2,
    serial_requests: int = 200,
    port: int = 8123,
) -> dict[str, Any]:
    """Deploy both ingresses over one tiny engine and measure p50/p99 latency and RPS of each."""
    import ray
    from ray import serve
    from ray.serve.llm.ingress import make_fastapi_ingress

    from bench.tiny_model import build_tiny_llama
    from gateway.app import tier_routes
    from gateway.ingress import GATEWAY_ROUTES, TandemIngress, create_fastapi_app
    from infra.registry import FileRegistry
    from serving.app import build_serving_app, model_card
    from serving.tiers import EngineConfig, TierConfig, resolve_tier, to_llm_config

    work = Path(tempfile.mkdtemp(prefix="tandem-bench-gateway-"))
    tiny = build_tiny_llama(work / "tiny")
    tier = TierConfig(
        name="standard",
        model_id="tandem-standard",
        model=str(tiny),
        engine=EngineConfig(max_model_len=256, gpu_memory_utilization=0.05, max_num_seqs=128),
    )
    resolved = [resolve_tier(tier, FileRegistry(work / "registry"))]
    init_ray(num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_serving_app(resolved), name="bare", route_prefix="/bare")
        engine = serve.get_deployment_handle("LLMServer:tandem-standard", app_name="bare")
        ingress: Any = serve.deployment(
            make_fastapi_ingress(TandemIngress, endpoint_map=GATEWAY_ROUTES, app=create_fastapi_app()),
            num_replicas=1,
            max_ongoing_requests=1000,
        )
        config = to_llm_config(resolved[0])
        serve.run(
            ingress.bind(
                llm_deployments={"tandem-standard": engine},
                model_cards={"tandem-standard": model_card(config)},
                tiers=[route.model_dump() for route in tier_routes(resolved)],
            ),
            name="gateway",
            route_prefix="/",
        )
        targets = {
            "bare": f"http://127.0.0.1:{port}/bare/v1/chat/completions",
            "gateway": f"http://127.0.0.1:{port}/v1/chat/completions",
        }

        async def measure() -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, float]]]:
            for url in targets.values():  # warm both paths
                await _load(url, "tandem-standard", 2 * concurrency, concurrency)
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
            for _ in range(rounds):
                for name, url in targets.items():
                    runs[name].append(await _load(url, "tandem-standard", requests, concurrency))
            return runs, await _serial(targets, "tandem-standard", serial_requests)

        runs, serial = asyncio.run(measure())
    finally:
        serve.shutdown()
        ray.shutdown()

    def merged(name: str) -> dict[str, float]:
        items = runs[name]
        return {
            "p50_ms": round(sum(r["p50_ms"] for r in items) / len(items), 2),
            "p99_ms": round(sum(r["p99_ms"] for r in items) / len(items), 2),
            "rps": round(sum(r["rps"] for r in items) / len(items), 1),
        }

    bare, gateway = merged("bare"), merged("gateway")
    return {
        "benchmark": "gateway-overhead",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "concurrency": concurrency,
        "requests_per_round": requests,
        "rounds": rounds,
        "bare": bare,
        "gateway": gateway,
        "added_p50_ms": round(gateway["p50_ms"] - bare["p50_ms"], 2),
        "added_p99_ms": round(gateway["p99_ms"] - bare["p99_ms"], 2),
        "rps_ratio": round(gateway["rps"] / bare["rps"], 3) if bare["rps"] else None,
        "serial": serial,
        "serial_added_p50_ms": round(serial["gateway"]["p50_ms"] - serial["bare"]["p50_ms"], 2),
        "serial_added_p99_ms": round(serial["gateway"]["p99_ms"] - serial["bare"]["p99_ms"], 2),
        "pipeline_in_process": {
            "json": measure_pipeline_cost(),
            "stream": measure_pipeline_cost(stream=True),
        },
        "runs": runs,
    }
