"""`tandem bench tiers`: TTFT, time per output token and tokens/s of each tier at 1 and N streams.

The measurement is end to end through the gateway's OpenAI API with streaming, so it is what a client
sees. Both tiers are measured in the same run against the same prompts; the fast/standard ratios are
what to compare across machines, not the absolute numbers.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

BENCH_PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a refrigerator works to a ten-year-old.",
    "Describe the water cycle step by step.",
    "Write a product description for a solar-powered lantern.",
    "List ten ideas for a weekend trip and explain each briefly.",
    "Explain the difference between TCP and UDP.",
    "Write a letter to a friend about learning to cook.",
    "Describe the history of the bicycle in a few paragraphs.",
]


@dataclass
class RequestSample:
    ttft_s: float
    total_s: float
    completion_tokens: int

    @property
    def tpot_s(self) -> float:
        return (self.total_s - self.ttft_s) / max(self.completion_tokens - 1, 1)


@dataclass
class LevelResult:
    tier: str
    streams: int
    requests: int
    wall_s: float
    completion_tokens: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    tpot_p50_ms: float
    tokens_per_s: float
    per_stream_tokens_per_s: float
    errors: int = 0
    samples: list[dict[str, float]] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _one_request(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int
) -> RequestSample:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM extension: decode exactly max_tokens so both tiers do the same work.
        "ignore_eos": True,
    }
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    ended = time.perf_counter()
    return RequestSample(ttft_s=(first or ended) - started, total_s=ended - started, completion_tokens=tokens)


async def measure_level(
    base_url: str, model: str, tier: str, streams: int, requests: int, max_tokens: int
) -> LevelResult:
    """Run ``requests`` streaming chats with ``streams`` in flight at a time."""
    url = f"{base_url}/v1/chat/completions"
    queue = list(range(requests))
    samples: list[RequestSample] = []
    errors = 0
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:

        async def worker() -> None:
            nonlocal errors
            while queue:
                index = queue.pop()
                try:
                    samples.append(
                        await _one_request(
                            client, url, model, BENCH_PROMPTS[index % len(BENCH_PROMPTS)], max_tokens
                        )
                    )
                except (httpx.HTTPError, RuntimeError):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        wall = time.perf_counter() - started
    total_tokens = sum(s.completion_tokens for s in samples)
    return LevelResult(
        tier=tier,
        streams=streams,
        requests=requests,
        wall_s=round(wall, 3),
        completion_tokens=total_tokens,
        ttft_p50_ms=round(1000 * _percentile([s.ttft_s for s in samples], 0.5), 1),
        ttft_p95_ms=round(1000 * _percentile([s.ttft_s for s in samples], 0.95), 1),
        tpot_p50_ms=round(1000 * _percentile([s.tpot_s for s in samples], 0.5), 2),
        tokens_per_s=round(total_tokens / wall, 2) if wall else 0.0,
        per_stream_tokens_per_s=round(
            statistics.median(s.completion_tokens / max(s.total_s, 1e-9) for s in samples), 2
        )
        if samples
        else 0.0,
        errors=errors,
        samples=[asdict(s) for s in samples],
    )


def run_tier_bench(
    base_url: str,
    *,
    models: dict[str, str],
    stream_levels: tuple[int, ...] = (1, 16),
    max_tokens: int = 128,
    requests_per_stream: int = 2,
    warmup: bool = True,
) -> dict[str, Any]:
    """Measure every tier at every concurrency level, interleaved, and compute fast/standard ratios."""

    async def run() -> list[LevelResult]:
        if warmup:
            for model in models.values():
                await measure_level(base_url, model, "warmup", 1, 1, 8)
        results = []
        for streams in stream_levels:
            requests = max(streams * requests_per_stream, 4)
            for tier, model in models.items():
                results.append(await measure_level(base_url, model, tier, streams, requests, max_tokens))
        return results

    levels = asyncio.run(run())
    ratios: dict[str, float] = {}
    for streams in stream_levels:
        by_tier = {r.tier: r for r in levels if r.streams == streams}
        if "standard" in by_tier and "fast" in by_tier and by_tier["standard"].tokens_per_s:
            ratios[f"fast_over_standard_tokens_per_s@{streams}"] = round(
                by_tier["fast"].tokens_per_s / by_tier["standard"].tokens_per_s, 3
            )
    return {
        "benchmark": "tiers",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "base_url": base_url,
        "max_tokens": max_tokens,
        "levels": [asdict(level) for level in levels],
        "ratios": ratios,
    }


def markdown_table(result: dict[str, Any]) -> str:
    """The README table for a tiers result."""
    lines = [
        "| tier | streams | TTFT p50 (ms) | TTFT p95 (ms) | TPOT p50 (ms) | tokens/s | per-stream tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for level in result["levels"]:
        lines.append(
            f"| {level['tier']} | {level['streams']} | {level['ttft_p50_ms']} | {level['ttft_p95_ms']} | "
            f"{level['tpot_p50_ms']} | {level['tokens_per_s']} | {level['per_stream_tokens_per_s']} |"
        )
    ratios = ", ".join(f"{k.split('@')[1]} streams: **{v}x**" for k, v in result["ratios"].items())
    return "\n".join(lines) + f"\n\nfast/standard tokens/s: {ratios}\n"
