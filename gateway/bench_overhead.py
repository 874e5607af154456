"""`tandem bench gateway`: what the Tandem ingress adds over Ray Serve LLM's bare ``OpenAiIngress``.

One Serve cluster, one cheap engine (a tiny random Llama, 1 output token), two ingresses in front of the
*same* LLMServer deployment: the bare ``OpenAiIngress`` at ``/bare`` and ``TandemIngress`` at ``/``. Load
alternates between them in rounds at the same concurrency, so the difference is the gateway's own cost.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from gateway.bench import _percentile


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


def run_gateway_overhead_bench(
    *, requests: int = 1000, concurrency: int = 64, rounds: int = 2, port: int = 8123
) -> dict[str, Any]:
    """Deploy both ingresses over one tiny engine and measure p50/p99 latency and RPS of each."""
    import ray
    from ray import serve
    from ray.serve.llm.ingress import make_fastapi_ingress

    from gateway.app import tier_routes
    from gateway.ingress import GATEWAY_ROUTES, TandemIngress, create_fastapi_app
    from infra.registry import FileRegistry
    from serving.app import build_serving_app, model_card
    from serving.tiers import EngineConfig, TierConfig, resolve_tier, to_llm_config
    from serving.tiny import build_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="tandem-bench-gateway-"))
    tiny = build_tiny_llama(work / "tiny")
    tier = TierConfig(
        name="standard",
        model_id="tandem-standard",
        model=str(tiny),
        engine=EngineConfig(max_model_len=256, gpu_memory_utilization=0.05, max_num_seqs=128),
    )
    resolved = [resolve_tier(tier, FileRegistry(work / "registry"))]
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
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

        async def measure() -> dict[str, list[dict[str, Any]]]:
            for url in targets.values():  # warm both paths
                await _load(url, "tandem-standard", 2 * concurrency, concurrency)
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
            for _ in range(rounds):
                for name, url in targets.items():
                    runs[name].append(await _load(url, "tandem-standard", requests, concurrency))
            return runs

        runs = asyncio.run(measure())
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
        "runs": runs,
    }
