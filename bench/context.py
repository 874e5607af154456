"""``tandem bench context``: how much one long prompt's prefill stalls short streams, chunked prefill on/off.

Per variant, one vLLM engine in its own process (:mod:`bench.context_engine`; engines never overlap) with
the served tiers' engine settings (:class:`serving.tiers.EngineConfig`) on the bundled model:

- ``unloaded``: ``streams`` short requests decode together; every gap between two consecutive output tokens
  of a stream is one time-per-output-token (TPOT) sample;
- ``loaded``: the same streams start, and once each has produced a few tokens one ~8k-token prompt arrives;
  the samples are the short streams' gaps that end while the long prompt is in flight (submitted -> done).

Variants: chunked prefill ``off`` (the whole prompt in one step), ``chunk-<N>`` (``max_num_batched_tokens``
= N) and ``vllm-default`` (nothing set: what ``tandem serve`` gets). Target: loaded p99 <= 2x unloaded p99.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from bench import RESULTS_DIR
from bench.engine_process import run_engine_process
from bench.recording import write_result
from infra.errors import TandemError
from serving.tiers import EngineConfig, base_engine_kwargs, engine_env, model_window

log = logging.getLogger(__name__)

#: vLLM 0.32 CPU's max_num_batched_tokens when nothing is set (engine/arg_utils.py get_batch_defaults:
#: 2048 for the OpenAI server, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS otherwise); recorded per run.
VLLM_DEFAULT_CHUNK = 2048


class ContextBenchError(TandemError):
    """A benchmark engine failed or the benchmark's settings cannot be measured."""


class ContextBenchConfig(BaseModel):
    """Every knob of ``tandem bench context``."""

    model: Path | None = Field(
        None, description="Model directory; default the bundled SmolLM2-135M-Instruct."
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="Engine settings; default those `tandem serve` runs."
    )
    streams: int = Field(8, ge=1, description="Short streams decoding concurrently.")
    short_prompt_tokens: tuple[int, int] = Field(
        (40, 100),
        description="Shortest and longest short prompt, in tokens (spread evenly over the streams).",
    )
    max_tokens: int = Field(64, ge=8, description="Tokens each short stream decodes unloaded (EOS ignored).")
    long_tokens: int = Field(8000, ge=16, description="Tokens of the long prompt.")
    long_max_tokens: int = Field(16, ge=1, description="Tokens the long prompt decodes.")
    tokens_before_long: int = Field(
        4, ge=1, description="Tokens every short stream has produced before the long prompt is submitted."
    )
    chunks: list[int] = Field(
        default_factory=lambda: [256, 512, 1024, 2048],
        description="max_num_batched_tokens values measured with chunked prefill on.",
    )
    chunked_off: bool = Field(True, description="Also measure chunked prefill off (whole prompt, one step).")
    vllm_default: bool = Field(True, description="Also measure vLLM's defaults (nothing set).")
    repeats: int = Field(
        1, ge=1, description="Unloaded and loaded phases per variant (a new long prompt each)."
    )
    target_ratio: float = Field(2.0, gt=0, description="Loaded p99 TPOT / unloaded p99 TPOT to meet.")
    engine_timeout_s: int = 1800
    results_dir: Path = RESULTS_DIR

    @model_validator(mode="after")
    def _check(self) -> ContextBenchConfig:
        low, high = self.short_prompt_tokens
        if not 1 <= low <= high:
            raise ValueError(f"short_prompt_tokens: expected 1 <= shortest <= longest, got {low}, {high}")
        if any(chunk < 16 for chunk in self.chunks):
            raise ValueError(f"chunks: every max_num_batched_tokens must be >= 16, got {self.chunks}")
        return self


def variant_names(config: ContextBenchConfig) -> list[str]:
    """The variants a config measures, in order."""
    names = ["off"] if config.chunked_off else []
    names += [f"chunk-{chunk}" for chunk in config.chunks]
    return names + (["vllm-default"] if config.vllm_default else [])


def variant_engine_args(variant: str, window: int) -> dict[str, Any]:
    """Scheduler arguments of a variant: ``off``, ``chunk-<N>`` or ``vllm-default``."""
    if variant == "off":
        return {"enable_chunked_prefill": False, "max_num_batched_tokens": window}
    if variant == "vllm-default":
        return {}
    if variant.startswith("chunk-") and variant.removeprefix("chunk-").isdigit():
        return {"enable_chunked_prefill": True, "max_num_batched_tokens": int(variant.removeprefix("chunk-"))}
    raise ContextBenchError(f"unknown variant {variant!r}: expected off, chunk-<N> or vllm-default")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), interpolating linearly between the closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def token_gaps(arrivals: list[float]) -> list[tuple[float, float]]:
    """(arrival time, gap) of each output token after a stream's first: its time per output token.

    Tokens that arrived together (the client lagged) share the gap since the previous arrival evenly.
    """
    gaps: list[tuple[float, float]] = []
    index, previous = 1, arrivals[0] if arrivals else 0.0
    while index < len(arrivals):
        end = index
        while end < len(arrivals) and arrivals[end] == arrivals[index]:
            end += 1
        share = (arrivals[index] - previous) / (end - index)
        gaps.extend((arrivals[index], share) for _ in range(end - index))
        previous, index = arrivals[index], end
    return gaps


def gap_stats(gaps: Iterable[float]) -> dict[str, Any]:
    """Count, p50, p99 and max of TPOT samples in seconds, reported in milliseconds."""
    values = list(gaps)
    if not values:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "count": len(values),
        "p50_ms": round(1000 * percentile(values, 50), 2),
        "p99_ms": round(1000 * percentile(values, 99), 2),
        "max_ms": round(1000 * max(values), 2),
    }


def summarise_variant(run: dict[str, Any]) -> dict[str, Any]:
    """One engine's raw arrivals -> unloaded and loaded TPOT statistics, their ratio, the long prompt's TTFT."""
    unloaded = [gap for phase in run["unloaded"] for a in phase["arrivals"] for _, gap in token_gaps(a)]
    loaded: list[float] = []
    prefill: list[float] = []
    outlived = True
    for phase in run["loaded"]:
        submitted, first, done = phase["long_submitted_s"], phase["long_first_token_s"], phase["long_done_s"]
        for arrivals in phase["arrivals"]:
            outlived = outlived and bool(arrivals) and arrivals[-1] >= done
            for end, gap in token_gaps(arrivals):
                if submitted < end <= done:
                    loaded.append(gap)
                    if end <= first:
                        prefill.append(gap)
    unloaded_stats, loaded_stats = gap_stats(unloaded), gap_stats(loaded)
    ratio = (
        round(loaded_stats["p99_ms"] / unloaded_stats["p99_ms"], 3)
        if loaded_stats["p99_ms"] is not None and unloaded_stats["p99_ms"]
        else None
    )
    ttfts = [phase["long_first_token_s"] - phase["long_submitted_s"] for phase in run["loaded"]]
    return {
        "enable_chunked_prefill": run["enable_chunked_prefill"],
        "max_num_batched_tokens": run["max_num_batched_tokens"],
        "unloaded": unloaded_stats,
        "loaded": loaded_stats,
        "loaded_during_prefill": gap_stats(prefill),
        "ratio": ratio,
        "long_ttft_s": round(max(ttfts), 3),
        # False: a short stream ended before the long prompt did, so the loaded window is partly unmeasured.
        "streams_outlived_long_prompt": outlived,
        "engine_start_s": round(run["engine_start_s"], 1),
    }


def best_chunk(variants: dict[str, dict[str, Any]], target_ratio: float) -> str | None:
    """The chunked variant with the lowest loaded p99 among those meeting ``target_ratio``; None if none does."""
    meeting = [
        name
        for name, v in variants.items()
        if v["enable_chunked_prefill"] and v["ratio"] is not None and v["ratio"] <= target_ratio
    ]
    return min(meeting, key=lambda name: variants[name]["loaded"]["p99_ms"]) if meeting else None


def markdown_table(summary: dict[str, Any]) -> str:
    """The variants as a Markdown table, then the best chunk size against the target."""
    rows = [
        "| variant | chunked prefill | max_num_batched_tokens | unloaded p99 TPOT ms | loaded p99 TPOT ms | "
        "ratio | max gap ms | long prompt TTFT s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, v in summary["variants"].items():
        rows.append(
            f"| {name} | {'on' if v['enable_chunked_prefill'] else 'off'} | {v['max_num_batched_tokens']} | "
            f"{v['unloaded']['p99_ms']} | {v['loaded']['p99_ms']} | {v['ratio']} | {v['loaded']['max_ms']} | "
            f"{v['long_ttft_s']} |"
        )
    best = summary["best_variant"]
    verdict = (
        f"best chunk size: **{summary['variants'][best]['max_num_batched_tokens']}** ({best}), meeting "
        f"ratio <= {summary['target_ratio']}"
        if best
        else f"no chunked variant meets ratio <= {summary['target_ratio']}; lowest ratio: "
        f"{summary['lowest_ratio_variant']}"
    )
    setting = (
        f"{summary['streams']} short streams ({summary['max_tokens']} tokens unloaded) while one "
        f"{summary['long_tokens']}-token prompt prefills; model {summary['model']}, dtype {summary['dtype']}."
    )
    return "\n".join(rows) + f"\n\n{verdict}\n\n{setting}\n"


def filler_token_ids(tokenizer: Any, tokens: int, seed: int) -> list[int]:
    """Exactly ``tokens`` token ids of neutral prose drawn with ``seed`` (distinct seeds share no prefix)."""
    from evalsuite.families.long_context.haystack import filler_sentence

    rng = random.Random(seed)
    text = f"Document {seed}. "
    ids: list[int] = []
    while len(ids) < tokens:
        text += " ".join(filler_sentence(rng) for _ in range(max(1, (tokens - len(ids)) // 12))) + " "
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids[:tokens]


def _run_engine(spec: dict[str, Any], label: str, env: dict[str, str], timeout_s: int) -> dict[str, Any]:
    return run_engine_process("bench.context_engine", spec, label, env, timeout_s, ContextBenchError)


def run_context_bench(
    config: ContextBenchConfig, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Measure every variant; write ``context-<time>.json``, ``context-latest.json`` and ``-latest.md``."""
    from transformers import AutoTokenizer

    from infra.bundled import prepare_bundled_model

    say = progress or (lambda message: log.info("event=context_bench %s", message))
    model_dir = config.model or prepare_bundled_model()
    window = config.engine.max_model_len or model_window(model_dir)
    if config.long_tokens + config.long_max_tokens > window:
        raise ContextBenchError(
            f"long_tokens + long_max_tokens = {config.long_tokens + config.long_max_tokens} exceeds the "
            f"engine's window of {window} tokens"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    low, high = config.short_prompt_tokens
    step = (high - low) / max(1, config.streams - 1)
    prompts = [filler_token_ids(tokenizer, round(low + i * step), seed=i) for i in range(config.streams)]
    long_prompts = [
        filler_token_ids(tokenizer, config.long_tokens, seed=1000 + i) for i in range(config.repeats)
    ]
    warmup = filler_token_ids(tokenizer, min(1024, config.long_tokens), seed=999)
    engine = {"model": str(model_dir), **base_engine_kwargs(config.engine), **config.engine.extra}
    env = engine_env(config.engine)
    started, load_before = time.perf_counter(), os.getloadavg()
    variants: dict[str, dict[str, Any]] = {}
    for name in variant_names(config):
        say(f"variant {name}: engine start, unloaded then loaded streams")
        scheduler = variant_engine_args(name, window)
        # Short streams must keep decoding for the whole long request: one step per prefill chunk + its decode.
        chunk = scheduler.get("max_num_batched_tokens", VLLM_DEFAULT_CHUNK)
        steps = math.ceil(config.long_tokens / chunk) + config.long_max_tokens
        spec = {
            "engine": {**engine, **scheduler},
            "prompts": prompts,
            "warmup_prompt": warmup,
            "long_prompts": long_prompts,
            "max_tokens": config.max_tokens,
            "loaded_max_tokens": config.max_tokens + config.tokens_before_long + steps,
            "long_max_tokens": config.long_max_tokens,
            "tokens_before_long": config.tokens_before_long,
            "repeats": config.repeats,
        }
        variants[name] = summarise_variant(_run_engine(spec, name, env, config.engine_timeout_s))
        say(f"variant {name}: loaded/unloaded p99 ratio {variants[name]['ratio']}")
    best = best_chunk(variants, config.target_ratio)
    chunked = [n for n, v in variants.items() if v["enable_chunked_prefill"] and v["ratio"] is not None]
    summary: dict[str, Any] = {
        "variants": variants,
        "best_variant": best,
        "best_chunk": variants[best]["max_num_batched_tokens"] if best else None,
        "lowest_ratio_variant": min(chunked, key=lambda n: variants[n]["ratio"]) if chunked else None,
        "target_ratio": config.target_ratio,
        "target_met": best is not None,
        "model": str(model_dir),
        "dtype": config.engine.dtype,
        "streams": config.streams,
        "short_prompt_tokens": [len(p) for p in prompts],
        "max_tokens": config.max_tokens,
        "long_tokens": config.long_tokens,
        "long_max_tokens": config.long_max_tokens,
        "tokens_before_long": config.tokens_before_long,
        "repeats": config.repeats,
        "measured_at": datetime.now(UTC).isoformat(),
        "bench_seconds": round(time.perf_counter() - started, 1),
        # The CPU is shared: how busy it was bounds how far timings can be trusted.
        "load_average_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpu_count": os.cpu_count(),
        "command": "tandem bench context",
    }
    path = write_result(summary, config.results_dir, "context", markdown_table(summary))
    summary["results_file"] = str(path)
    return summary
