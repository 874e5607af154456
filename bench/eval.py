"""``tandem bench eval``: bwrap sandbox latency and suite throughput, as JSON under bench/results/."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import RESULTS_DIR

log = logging.getLogger(__name__)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def _sandbox_latencies(sandboxes: int, concurrency: int) -> dict[str, list[float]]:
    from evalsuite.sandbox import BwrapConfig, BwrapSandboxEnvironment

    gate = asyncio.Semaphore(concurrency)
    phases: dict[str, list[float]] = {"start": [], "exec": [], "cleanup": [], "total": []}

    async def one() -> None:
        async with gate:
            t0 = time.perf_counter()
            environment = BwrapSandboxEnvironment(BwrapConfig())
            t1 = time.perf_counter()
            result = await environment.exec(["bash", "-c", "echo ok"])
            t2 = time.perf_counter()
            await environment.close()
            t3 = time.perf_counter()
            if result.stdout.strip() != "ok":
                raise RuntimeError(f"sandbox exec failed: {result.stderr}")
            for key, value in (
                ("start", t1 - t0),
                ("exec", t2 - t1),
                ("cleanup", t3 - t2),
                ("total", t3 - t0),
            ):
                phases[key].append(value * 1000)

    await asyncio.gather(*(one() for _ in range(sandboxes)))
    return phases


def _instant_answer(*_: Any) -> Any:
    """mockllm output with usage preset (otherwise mockllm counts tokens with tiktoken, which downloads)."""
    from inspect_ai.model import ModelOutput, ModelUsage

    output = ModelOutput.from_content("mockllm", "ANSWER: 0")
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


def run_eval_bench(
    concurrency: int = 4,
    sandboxes: int = 32,
    samples_per_family: int = 8,
    output_dir: str | Path = RESULTS_DIR,
    model: str = "mockllm/model",
) -> dict[str, Any]:
    """Measure sandbox start+exec+cleanup latency (ms, p50/p95) and suite throughput (samples/s).

    Throughput runs every registered family at ``concurrency`` concurrent samples against ``model``; the default
    mockllm answers instantly, so the figure is the harness + sandbox + scoring ceiling, not a model's speed.
    """
    from inspect_ai import eval as inspect_eval

    from evalsuite.registry import family_names
    from evalsuite.runner import build_tasks, resolve_model

    phases = asyncio.run(_sandbox_latencies(sandboxes, concurrency))
    latency = {
        phase: {"p50_ms": round(statistics.median(v), 2), "p95_ms": round(_percentile(v, 0.95), 2)}
        for phase, v in phases.items()
    }
    tasks = build_tasks(list(family_names()), split="dev", limit=samples_per_family)
    log_dir = tempfile.mkdtemp(prefix="tandem-eval-bench-")
    started = time.perf_counter()
    model_args: dict[str, Any] = {"custom_outputs": _instant_answer} if model.startswith("mockllm/") else {}
    logs = inspect_eval(tasks, model=resolve_model(model, None, **model_args), max_samples=concurrency, display="none",
                        log_dir=log_dir)  # fmt: skip
    elapsed = time.perf_counter() - started
    samples = sum(len(lg.samples or []) for lg in logs)
    shutil.rmtree(log_dir, ignore_errors=True)
    throughput = round(samples / elapsed, 3)
    result: dict[str, Any] = {
        "benchmark": "eval",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "concurrency": concurrency,
        "sandboxes": sandboxes,
        "sandbox_latency": latency,
        "suite": {
            "model": model,
            "samples": samples,
            "seconds": round(elapsed, 2),
            "samples_per_s": throughput,
        },
    }
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"eval-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=2))
    (directory / "eval-latest.json").write_text(json.dumps(result, indent=2))
    result["path"] = str(path)
    log.info("event=bench_eval path=%s samples_per_s=%s", path, throughput)
    return result
