"""`tandem bench load`: a bounded loopback load test of a running gateway, optionally killing the fast
tier's replica mid-run (Ray Serve restarts it; the gateway fails requests over to the standard tier).

It reports every status code seen, checks that each 429 carries ``Retry-After`` and an OpenAI error
body, and counts 5xx, which should be zero.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.tiers import _percentile
from infra.errors import TandemError
from infra.lifecycle import init_ray

MODELS = ("standard", "fast", "auto")


def kill_fast_replica(app_name: str = "tandem", ray_address: str = "auto") -> str:
    """Kill the fast tier's LLMServer replica actor in the gateway's Ray cluster; returns its name."""
    import ray

    if not ray.is_initialized():
        init_ray(address=ray_address, log_to_driver=False)
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if name.startswith(f"SERVE_REPLICA::{app_name}#LLMServer:tandem-fast#"):
            ray.kill(ray.get_actor(name, namespace=actor["namespace"]), no_restart=True)
            return str(name)
    raise TandemError(
        f"no replica of the fast tier found in Ray application {app_name!r}: is `tandem serve` running?"
    )


async def _run(
    base_url: str,
    api_key: str,
    limited_key: str | None,
    requests: int,
    concurrency: int,
    max_tokens: int,
    kill_at: int | None,
    ray_address: str,
) -> dict[str, Any]:
    url = f"{base_url}/v1/chat/completions"
    statuses: dict[int, int] = {}
    bad_429: list[str] = []
    server_errors: list[str] = []
    latencies: list[float] = []
    next_index = 0
    killed: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def worker() -> None:
            nonlocal next_index
            while next_index < requests:
                index = next_index
                next_index += 1
                if kill_at is not None and index == kill_at and not killed:
                    killed["replica"] = await asyncio.to_thread(kill_fast_replica, "tandem", ray_address)
                    killed["at_request"] = index
                    killed["at_s"] = round(time.perf_counter() - started, 2)
                key = limited_key if limited_key and index % 10 == 0 else api_key
                body = {
                    "model": MODELS[index % len(MODELS)],
                    "messages": [
                        {"role": "user", "content": f"Say a number between 1 and {index % 97 + 2}."}
                    ],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "stream": index % 2 == 0,
                }
                began = time.perf_counter()
                try:
                    response = await client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
                    await response.aread()
                    status = response.status_code
                except httpx.HTTPError as exc:
                    status = 599
                    server_errors.append(f"request {index}: transport error {exc!r}"[:200])
                    response = None
                latencies.append(time.perf_counter() - began)
                statuses[status] = statuses.get(status, 0) + 1
                if response is not None and status == 429:
                    error = response.json().get("error", {}) if response.content else {}
                    if "retry-after" not in response.headers or error.get("type") != "rate_limit_error":
                        bad_429.append(f"request {index}: {response.headers} {response.text[:120]}")
                if response is not None and status >= 500:
                    server_errors.append(f"request {index} ({body['model']}): {status} {response.text[:160]}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {
        "requests": requests,
        "concurrency": concurrency,
        "wall_s": round(wall, 2),
        "rps": round(requests / wall, 2),
        "p50_ms": round(1000 * _percentile(latencies, 0.5), 1),
        "p99_ms": round(1000 * _percentile(latencies, 0.99), 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_errors": len(server_errors),
        "server_error_samples": server_errors[:10],
        "malformed_429": len(bad_429),
        "malformed_429_samples": bad_429[:5],
        "killed": killed or None,
    }


def run_load_test(
    base_url: str,
    api_key: str,
    *,
    limited_key: str | None = None,
    requests: int = 2000,
    concurrency: int = 64,
    max_tokens: int = 8,
    kill_fast: bool = False,
    ray_address: str = "auto",
) -> dict[str, Any]:
    """Send ``requests`` chats at ``concurrency``; with ``kill_fast`` the fast replica dies a third in."""
    result = asyncio.run(
        _run(
            base_url.rstrip("/"),
            api_key,
            limited_key,
            requests,
            concurrency,
            max_tokens,
            requests // 3 if kill_fast else None,
            ray_address,
        )
    )
    return {"benchmark": "load", "created_at": datetime.now(UTC).isoformat(timespec="seconds")} | result
