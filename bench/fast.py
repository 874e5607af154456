"""``tandem bench fast``: the fast tier against the best-tuned standard tier, with vLLM, side by side.

Engines run one after another, each in its own process (:mod:`bench.fast_engine`), on the same held-out
chat prompts (never trained on) and the same engine settings as the served tiers (``EngineConfig``):

- ``standard``: the plain engine, per engine-tuning variant (e.g. with and without Intel OpenMP preloaded);
- ``fast``: the same engine + the EAGLE-3 head (``speculative_config.method: eagle3``);
- ``oracle-k<K>``: a proposer that replays the standard engine's own greedy output (:mod:`bench.oracle`):
  every draft is accepted, so this is the ceiling the engine allows at that k;
- ``untrained``: a randomly initialised head of the same shape: acceptance ~0, so its slowdown is the
  true per-step cost of drafting and verifying (c);
- ``ngram``: vLLM's prompt lookup, the fast tier's fallback.

Each runs 1, 4 and 16 concurrent streams (the oracle/untrained/ngram engines run one stream). Greedy
outputs of fast and standard are compared token by token (float32: lossless means identical).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

from pydantic import BaseModel, Field

from bench.engine_process import run_engine_process
from distill.prompts import load_prompts
from infra.cpu_engine import intel_openmp_library
from infra.errors import TandemError
from infra.registry import open_registry

log = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_TEACHER = "smollm2-135m-instruct@base"


#: The standard tier's tuning variants a plain ``tandem bench fast`` measures (all of them: ``VARIANTS``).
DEFAULT_VARIANTS = ("iomp", "iomp-allcores", "iomp-allcores-compiled")


class FastBenchError(TandemError):
    """A benchmark engine failed or its inputs are missing."""


class FastBenchConfig(BaseModel):
    """Every knob of ``tandem bench fast``."""

    teacher: str = DEFAULT_TEACHER
    draft: str | None = Field(
        None, description="EAGLE-3 head ref or directory; default the teacher's newest."
    )
    num_speculative_tokens: int | None = Field(
        None, ge=1, description="k; default the fastest of k_sweep, else the head's recorded k."
    )
    k_sweep: list[int] = Field(
        default_factory=list,
        description="k values timed at one stream before the full run; the fastest is the k the full run "
        "uses. The head records k from an offline cost model; this measures it. Ignored when k is given.",
    )
    compare: list[str] = Field(
        default_factory=list,
        description="Further EAGLE-3 heads (registry refs or directories) timed at one stream with the same "
        "engine and k: a paired comparison of training rounds, free of the drift between two runs.",
    )
    bracket: bool = Field(
        True,
        description="Time the standard tier at one stream again after the fast runs; the one-stream "
        "baseline is the mean of the two timings (the shared CPU drifts), their difference is reported.",
    )
    streams: list[int] = Field(default_factory=lambda: [1, 4, 16])
    requests_per_stream: int = Field(2, ge=1, description="Requests per stream at >1 streams.")
    single_requests: int = Field(8, ge=1, description="Requests sent one at a time.")
    max_tokens: int = Field(128, ge=8)
    oracle_ks: list[int] = Field(
        default_factory=lambda: [3, 5], description="k values of the oracle ceiling."
    )
    untrained: bool = Field(True, description="Also time an untrained head of the same shape (true c).")
    ngram: bool = Field(True, description="Also time vLLM n-gram prompt lookup.")
    variants: list[str] = Field(
        default_factory=lambda: list(DEFAULT_VARIANTS),
        description="Engine tuning variants measured for the standard tier (see VARIANTS); the fastest at "
        "one stream is the baseline and the fast tier runs with it.",
    )
    shared_host: list[str] = Field(
        default_factory=lambda: ["iomp", "iomp-allcores"],
        description="Variants also timed as two standard engines decoding at once, one stream each (the two "
        "tiers of `tandem serve` share this host's cores): does binding every core still pay when a second "
        "engine competes for them?",
    )
    dtype: str = Field("float32", description="Both tiers' dtype (float32: greedy identity is exact).")
    max_num_seqs: int = 32
    kv_cache_memory_bytes: int = 1 << 30
    registry_url: str | None = None
    engine_timeout_s: int = 1800
    results_dir: Path = RESULTS_DIR


#: Engine tuning variants: name -> (what it changes, environment, engine arguments).
VARIANTS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "default": ("eager, OpenMP as torch ships it, threads bound by vLLM", {}, {}),
    "iomp": ("Intel OpenMP preloaded (vLLM CPU's advice)", {"LD_PRELOAD": "iomp"}, {}),
    "iomp-compiled": (
        "Intel OpenMP + torch.compile (enforce_eager off)",
        {"LD_PRELOAD": "iomp"},
        {"enforce_eager": False},
    ),
    "iomp-1core": (
        "Intel OpenMP + the model on core 0 only, leaving core 1 to the engine's scheduler process",
        {"LD_PRELOAD": "iomp", "VLLM_CPU_OMP_THREADS_BIND": "0"},
        {},
    ),
    "iomp-allcores": (
        "Intel OpenMP + model threads on every core (vLLM reserves none for its scheduler process)",
        {"LD_PRELOAD": "iomp", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
        {},
    ),
    "iomp-allcores-compiled": (
        "Intel OpenMP + every core + torch.compile (enforce_eager off)",
        {"LD_PRELOAD": "iomp", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
        {"enforce_eager": False},
    ),
}


def variant_settings(variant: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment and engine arguments of a tuning variant."""
    if variant not in VARIANTS:
        raise FastBenchError(f"unknown tuning variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    _, env, engine = VARIANTS[variant]
    if env.get("LD_PRELOAD") == "iomp":
        library = intel_openmp_library()
        if library is None:
            raise FastBenchError(f"variant {variant!r}: libiomp5.so not found under the environment's lib/")
        env = {**env, "LD_PRELOAD": str(library)}
    return env, engine


def _run_engine(spec: dict[str, Any], label: str, env: dict[str, str], timeout_s: int) -> dict[str, Any]:
    return run_engine_process("bench.fast_engine", spec, label, env, timeout_s, FastBenchError)


def _run_engine_pair(spec: dict[str, Any], label: str, env: dict[str, str], timeout_s: int) -> dict[str, Any]:
    """Two engine processes on ``spec`` at once, timing their phases from a common start (a barrier after
    warm-up): {"engines": [result, result]}."""
    from concurrent.futures import ThreadPoolExecutor

    with tempfile.TemporaryDirectory(prefix="tandem-bench-barrier-") as barrier:
        paired = {**spec, "start_barrier": {"dir": barrier, "parties": 2}}
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(_run_engine, paired, f"{label}-{i}", env, timeout_s) for i in range(2)]
            return {"engines": [future.result() for future in futures]}


def single_phase(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in phases if p["streams"] == 1]


def chat_token_ids(model_dir: Path, prompts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = []
    for prompt in prompts:
        ids: Any = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        rows.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return rows


def compare_tokens(reference: list[list[int]], candidate: list[list[int]]) -> dict[str, Any]:
    identical = sum(a == b for a, b in zip(reference, candidate, strict=True))
    return {"identical": identical, "total": len(reference), "lossless": identical == len(reference)}


def memory_bandwidth_gbps(megabytes: int = 512) -> float:
    """Read bandwidth with torch (sum over a large float32 tensor), best of 5."""
    import torch

    tensor = torch.ones(megabytes * 1024 * 1024 // 4)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        tensor.sum()
        best = min(best, time.perf_counter() - started)
    return tensor.numel() * 4 / best / 1e9


def _phase_summary(phase: dict[str, Any]) -> dict[str, Any]:
    requests = phase["requests"]
    summary = {
        "streams": phase["streams"],
        "tokens_per_s": round(phase["tokens_per_s"], 2),
        "tpot_p50_ms": round(1000 * median(r["tpot_s"] for r in requests), 2),
        "ttft_p50_ms": round(1000 * median(r["ttft_s"] for r in requests), 2),
        "generated_tokens": phase["generated_tokens"],
    }
    spec = phase.get("spec_decode")
    if spec:
        summary["acceptance_rate"] = round(spec["acceptance_rate"], 4) if spec["acceptance_rate"] else None
        summary["mean_acceptance_length"] = (
            round(spec["mean_acceptance_length"], 4) if spec["mean_acceptance_length"] else None
        )
        summary["accepted_per_position"] = spec["accepted_per_position"]
    return summary


def run_fast_bench(
    config: FastBenchConfig, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Measure every engine of the module docstring; write ``fast-<time>.json`` + ``fast-latest.json``."""
    from distill.eagle3.head import Eagle3Head, is_eagle3_dir
    from serving.tiers import newest_draft_for

    say = progress or (lambda message: log.info("event=fast_bench %s", message))
    registry = open_registry(config.registry_url)
    teacher = registry.manifest(config.teacher)
    teacher_dir = registry.fetch(teacher.ref)

    def resolve_head(draft: str | None) -> tuple[Path, str, int | None]:
        """A head's directory, name and recorded k, from a directory or a registry ref (None: the newest)."""
        if draft and Path(draft).expanduser().is_dir():
            head_dir, ref, recorded = Path(draft).expanduser(), draft, None
        else:
            manifest = (
                registry.manifest(draft)
                if draft
                else newest_draft_for(registry, teacher.ref, method="eagle3")
            )
            if manifest is None:
                raise FastBenchError(
                    f"no EAGLE-3 head for {teacher.ref}: run `tandem distill --method eagle3` first"
                )
            head_dir, ref = registry.fetch(manifest.ref), manifest.ref
            recorded = manifest.metadata.get("num_speculative_tokens")
        if not is_eagle3_dir(head_dir):
            raise FastBenchError(f"{ref}: not an EAGLE-3 head (config.json architectures)")
        return head_dir, ref, recorded

    draft_dir, draft_ref, recorded_k = resolve_head(config.draft)
    compared = [resolve_head(ref)[:2] for ref in config.compare]  # refused before any engine starts
    k = int(config.num_speculative_tokens or recorded_k or 3)

    heldout = load_prompts(split="heldout")
    needed = max(config.single_requests, max(config.streams) * config.requests_per_stream)
    prompts = chat_token_ids(teacher_dir, (heldout * (needed // len(heldout) + 1))[:needed])
    phases = [
        {
            "name": f"{s}",
            "streams": s,
            "requests": config.single_requests if s == 1 else s * config.requests_per_stream,
        }
        for s in config.streams
    ]
    engine = {
        "model": str(teacher_dir),
        "dtype": config.dtype,
        "enforce_eager": True,
        "max_model_len": 2048,
        "max_num_seqs": config.max_num_seqs,
        "kv_cache_memory_bytes": config.kv_cache_memory_bytes,
        "seed": 0,
    }
    base = {"prompts": prompts, "max_tokens": config.max_tokens}
    started, load_before = time.perf_counter(), os.getloadavg()
    runs: dict[str, dict[str, Any]] = {}

    for variant in config.variants:
        say(f"standard engine ({variant})")
        variant_env, variant_engine = variant_settings(variant)
        runs[f"standard[{variant}]"] = _run_engine(
            {**base, "engine": {**engine, **variant_engine}, "phases": phases},
            f"standard-{variant}",
            variant_env,
            config.engine_timeout_s,
        )
    for variant in config.shared_host:
        say(f"two standard engines at once ({variant}, one stream each)")
        shared_env, shared_engine = variant_settings(variant)
        runs[f"shared[{variant}]"] = _run_engine_pair(
            {**base, "engine": {**engine, **shared_engine}, "phases": single_phase(phases)},
            f"shared-{variant}",
            shared_env,
            config.engine_timeout_s,
        )
    best_variant = max(config.variants, key=lambda v: runs[f"standard[{v}]"]["phases"]["1"]["tokens_per_s"])
    env, best_engine = variant_settings(best_variant)
    engine = {**engine, **best_engine}
    single = single_phase(phases)

    def eagle_config(n: int) -> dict[str, Any]:
        return {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": n}

    if config.k_sweep and config.num_speculative_tokens is None:
        for sweep_k in config.k_sweep:
            say(f"k sweep: eagle3 k={sweep_k}, one stream")
            runs[f"sweep-k{sweep_k}"] = _run_engine(
                {**base, "engine": {**engine, "speculative_config": eagle_config(sweep_k)}, "phases": single},
                f"sweep-k{sweep_k}",
                env,
                config.engine_timeout_s,
            )
        k = max(config.k_sweep, key=lambda n: runs[f"sweep-k{n}"]["phases"]["1"]["tokens_per_s"])
    eagle = eagle_config(k)
    say(f"fast engine (eagle3, k={k}, {best_variant})")
    runs["fast"] = _run_engine(
        {**base, "engine": {**engine, "speculative_config": eagle}, "phases": phases},
        "fast",
        env,
        config.engine_timeout_s,
    )
    for other_dir, other_ref in compared:
        say(f"compared head {other_ref} (eagle3, k={k}, one stream)")
        runs[f"compare[{other_ref}]"] = _run_engine(
            {
                **base,
                "engine": {**engine, "speculative_config": {**eagle, "model": str(other_dir)}},
                "phases": single,
            },
            f"compare-{Path(other_ref).name}",
            env,
            config.engine_timeout_s,
        )
    reference = runs[f"standard[{best_variant}]"]["phases"]["1"]["requests"]
    with tempfile.TemporaryDirectory(prefix="tandem-oracle-") as scratch:
        oracle_file = Path(scratch) / "oracle.json"
        oracle_file.write_text(
            json.dumps([ids + r["token_ids"] for ids, r in zip(prompts, reference, strict=False)])
        )
        for oracle_k in config.oracle_ks:
            say(f"oracle ceiling k={oracle_k}")
            runs[f"oracle-k{oracle_k}"] = _run_engine(
                {
                    **base,
                    "engine": {
                        **engine,
                        "speculative_config": {
                            "method": "custom_class",
                            "model": "bench.oracle.OracleProposer",
                            "num_speculative_tokens": oracle_k,
                        },
                    },
                    "phases": single,
                },
                f"oracle-k{oracle_k}",
                {**env, "TANDEM_ORACLE_FILE": str(oracle_file)},
                config.engine_timeout_s,
            )
        if config.untrained:
            say("untrained head (cost of drafting)")
            untrained_dir = Path(scratch) / "untrained"
            head = Eagle3Head.load_vllm(draft_dir)
            fresh = Eagle3Head(head.shape)
            fresh.d2t.copy_(head.d2t)
            fresh.t2d.copy_(head.t2d)
            fresh.save_vllm(untrained_dir)
            runs["untrained"] = _run_engine(
                {
                    **base,
                    "engine": {**engine, "speculative_config": {**eagle, "model": str(untrained_dir)}},
                    "phases": single,
                },
                "untrained",
                env,
                config.engine_timeout_s,
            )
    if config.ngram:
        say("n-gram prompt lookup")
        runs["ngram"] = _run_engine(
            {
                **base,
                "engine": {
                    **engine,
                    "speculative_config": {
                        "method": "ngram",
                        "num_speculative_tokens": k,
                        "prompt_lookup_max": 4,
                        "prompt_lookup_min": 2,
                    },
                },
                "phases": single,
            },
            "ngram",
            env,
            config.engine_timeout_s,
        )

    if config.bracket and 1 in config.streams:
        say(f"standard engine again ({best_variant}, one stream)")
        runs["standard-again"] = _run_engine(
            {**base, "engine": engine, "phases": single}, "standard-again", env, config.engine_timeout_s
        )

    summary = summarise(runs, best_variant, k)
    bandwidth = memory_bandwidth_gbps()
    weight_bytes = sum(p.stat().st_size for p in teacher_dir.glob("*.safetensors"))
    bytes_fp32 = weight_bytes * (2 if "bfloat16" in (teacher_dir / "config.json").read_text() else 1)
    bound_ms = bytes_fp32 / (bandwidth * 1e9) * 1000
    summary.update(
        {
            "teacher": teacher.ref,
            "draft": draft_ref,
            "num_speculative_tokens": k,
            "max_tokens": config.max_tokens,
            "tuning_variant": best_variant,
            "tuning_variants": {name: VARIANTS[name][0] for name in config.variants},
            "memory_bandwidth_gbps": round(bandwidth, 1),
            "bandwidth_bound_tpot_ms": round(bound_ms, 2),
            "standard_tpot_over_bound": round(summary["standard"]["1"]["tpot_p50_ms"] / bound_ms, 3),
            "measured_at": datetime.now(UTC).isoformat(),
            "bench_seconds": round(time.perf_counter() - started, 1),
            # The CPU is shared: how busy it was bounds how far timings can be trusted.
            "load_average_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "cpu_count": os.cpu_count(),
            "command": "tandem bench fast",
        }
    )
    draft_report = draft_dir / "eagle3_report.json"
    if draft_report.is_file():
        offline = json.loads(draft_report.read_text())
        summary["offline_acceptance"] = offline.get("acceptance")
        summary["train_completion_tokens"] = offline.get("train_completion_tokens")
    write_result(summary, config.results_dir)
    return summary


def summarise(runs: dict[str, dict[str, Any]], best_variant: str, k: int) -> dict[str, Any]:
    standard = runs[f"standard[{best_variant}]"]["phases"]
    fast = runs["fast"]["phases"]
    summary: dict[str, Any] = {
        "variants": {
            name.removeprefix("standard[").removesuffix("]"): {
                p: _phase_summary(v) for p, v in run["phases"].items()
            }
            for name, run in runs.items()
            if name.startswith("standard[")
        },
        "engine_start_s": {
            name: round(run["engine_start_s"], 1) for name, run in runs.items() if "engine_start_s" in run
        },
        "standard": {p: _phase_summary(v) for p, v in standard.items()},
        "fast": {p: _phase_summary(v) for p, v in fast.items()},
    }
    base_tps = standard["1"]["tokens_per_s"]
    reference = [r["token_ids"] for r in standard["1"]["requests"]]
    if "standard-again" in runs:
        # The one-stream baseline brackets the fast runs: its timings before and after, averaged.
        again = runs["standard-again"]["phases"]["1"]
        summary["standard_bracket"] = {
            "before_tokens_per_s": round(base_tps, 2),
            "after_tokens_per_s": round(again["tokens_per_s"], 2),
            "drift": round(again["tokens_per_s"] / base_tps - 1, 3),
            "lossless": compare_tokens(reference, [r["token_ids"] for r in again["requests"]]),
        }
        base_tps = (base_tps + again["tokens_per_s"]) / 2
    baseline = {p: base_tps if p == "1" else standard[p]["tokens_per_s"] for p in standard}
    summary["speedup"] = {p: round(fast[p]["tokens_per_s"] / baseline[p], 3) for p in fast}
    slower = [int(p) for p, ratio in summary["speedup"].items() if ratio < 1.0]
    summary["crossover_streams"] = min(slower) if slower else None
    summary["lossless"] = {
        p: compare_tokens(
            [r["token_ids"] for r in standard[p]["requests"]], [r["token_ids"] for r in fast[p]["requests"]]
        )
        for p in fast
    }
    summary["oracle"] = {
        name.removeprefix("oracle-k"): {
            **_phase_summary(run["phases"]["1"]),
            "speedup": round(run["phases"]["1"]["tokens_per_s"] / base_tps, 3),
        }
        for name, run in runs.items()
        if name.startswith("oracle-k")
    }
    if "untrained" in runs:
        phase = runs["untrained"]["phases"]["1"]
        ratio = phase["tokens_per_s"] / base_tps
        length = (phase.get("spec_decode") or {}).get("mean_acceptance_length") or 1.0
        summary["untrained"] = {**_phase_summary(phase), "speedup": round(ratio, 3)}
        # Single-stream step model: ratio = E[tokens per step] / (1 + k c)  =>  c (verification included).
        summary["cost_ratio_c"] = round((length / ratio - 1) / k, 4)
    sweep = {
        name.removeprefix("sweep-k"): run["phases"]["1"]
        for name, run in runs.items()
        if name.startswith("sweep-k")
    }
    compared = {
        name.removeprefix("compare[").removesuffix("]"): run["phases"]["1"]
        for name, run in runs.items()
        if name.startswith("compare[")
    }
    for key, phases in (("k_sweep", sweep), ("compare", compared)):
        if phases:
            summary[key] = {
                n: {
                    **_phase_summary(phase),
                    "speedup": round(phase["tokens_per_s"] / base_tps, 3),
                    "lossless": compare_tokens(reference, [r["token_ids"] for r in phase["requests"]]),
                }
                for n, phase in phases.items()
            }
    shared = {
        name.removeprefix("shared[").removesuffix("]"): [e["phases"]["1"] for e in run["engines"]]
        for name, run in runs.items()
        if name.startswith("shared[")
    }
    if shared:
        summary["shared_host"] = {
            variant: {
                "tokens_per_s": [round(p["tokens_per_s"], 2) for p in pair],
                "total_tokens_per_s": round(sum(p["tokens_per_s"] for p in pair), 2),
                "tpot_p50_ms": [_phase_summary(p)["tpot_p50_ms"] for p in pair],
                "alone_tokens_per_s": summary["variants"].get(variant, {}).get("1", {}).get("tokens_per_s"),
            }
            for variant, pair in shared.items()
        }
    if "ngram" in runs:
        phase = runs["ngram"]["phases"]["1"]
        summary["ngram"] = {**_phase_summary(phase), "speedup": round(phase["tokens_per_s"] / base_tps, 3)}
    if summary["oracle"]:
        ceiling = max(v["speedup"] for v in summary["oracle"].values())
        summary["oracle_ceiling_speedup"] = ceiling
        summary["fraction_of_ceiling"] = round(summary["speedup"]["1"] / ceiling, 3)
    return summary


def markdown_table(summary: dict[str, Any]) -> str:
    rows = [
        "| engine | streams | tok/s | TPOT p50 ms | fast/standard | acceptance rate | accepted per position |",
        "|---|---|---|---|---|---|---|",
    ]
    for streams, phase in summary["standard"].items():
        rows.append(
            f"| standard ({summary['tuning_variant']}) | {streams} | {phase['tokens_per_s']} | {phase['tpot_p50_ms']} | 1.0 | | |"
        )
        fast = summary["fast"][streams]
        rows.append(
            f"| fast (eagle3, k={summary['num_speculative_tokens']}) | {streams} | {fast['tokens_per_s']} | {fast['tpot_p50_ms']} | "
            f"**{summary['speedup'][streams]}** | {fast.get('acceptance_rate')} | {fast.get('accepted_per_position')} |"
        )
    for variant, by_streams in summary.get("variants", {}).items():
        if variant != summary["tuning_variant"] and "1" in by_streams:
            phase = by_streams["1"]
            rows.append(
                f"| standard, tuning variant {variant} | 1 | {phase['tokens_per_s']} | {phase['tpot_p50_ms']} | | | |"
            )
    for variant, pair in summary.get("shared_host", {}).items():
        rows.append(
            f"| two standard engines at once ({variant}), each | 1 + 1 | {' + '.join(map(str, pair['tokens_per_s']))} "
            f"= {pair['total_tokens_per_s']} | {' / '.join(map(str, pair['tpot_p50_ms']))} | | | |"
        )
    bracket = summary.get("standard_bracket")
    if bracket:
        rows.append(
            f"| standard again, after the fast runs (drift {bracket['drift']:+.1%}) | 1 | {bracket['after_tokens_per_s']} | | 1.0 | | |"
        )
    labelled = [
        *((f"k sweep: eagle3 k={k}", phase) for k, phase in summary.get("k_sweep", {}).items()),
        *(
            (f"compared head {ref} (k={summary['num_speculative_tokens']})", phase)
            for ref, phase in summary.get("compare", {}).items()
        ),
    ]
    for label, phase in labelled:
        rows.append(
            f"| {label} | 1 | {phase['tokens_per_s']} | {phase['tpot_p50_ms']} | {phase['speedup']} | {phase.get('acceptance_rate')} | {phase.get('accepted_per_position')} |"
        )
    for k, phase in summary.get("oracle", {}).items():
        rows.append(
            f"| oracle ceiling k={k} | 1 | {phase['tokens_per_s']} | {phase['tpot_p50_ms']} | {phase['speedup']} | {phase.get('acceptance_rate')} | |"
        )
    for name in ("untrained", "ngram"):
        if name in summary:
            phase = summary[name]
            rows.append(
                f"| {name} | 1 | {phase['tokens_per_s']} | {phase['tpot_p50_ms']} | {phase['speedup']} | {phase.get('acceptance_rate')} | |"
            )
    if "standard_tpot_over_bound" in summary:
        rows.append(
            f"\nStandard tier TPOT / bandwidth bound: **{summary['standard_tpot_over_bound']}** (bound "
            f"{summary['bandwidth_bound_tpot_ms']} ms per token at {summary['memory_bandwidth_gbps']} GB/s)."
        )
    return "\n".join(rows) + "\n"


def write_result(summary: dict[str, Any], results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = results_dir / f"fast-{stamp}.json"
    text = json.dumps(summary, indent=2)
    path.write_text(text)
    (results_dir / "fast-latest.json").write_text(text)
    (results_dir / "fast-latest.md").write_text(markdown_table(summary))
    summary["results_file"] = str(path)
    return path
