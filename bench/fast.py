"""``tandem bench fast``: the fast tier against the best-tuned standard tier, with vLLM, side by side.

Engines run in their own processes (:mod:`bench.fast_engine`), on the same held-out chat prompts (never
trained on) and the same engine settings as the served tiers (``EngineConfig``):

- ``standard``: the plain engine, per engine-tuning variant (e.g. with and without Intel OpenMP preloaded);
- ``fast``: the same engine + the EAGLE-3 head (``speculative_config.method: eagle3``);
- ``oracle-k<K>``: a proposer that replays the standard engine's own greedy output (:mod:`bench.oracle`):
  every draft is accepted, so this is the ceiling the engine allows at that k;
- ``untrained``: a randomly initialised head of the same shape: acceptance ~0, so its slowdown is the
  true per-step cost of drafting and verifying (c);
- ``ngram``: vLLM's prompt lookup, the fast tier's fallback.

At one stream every engine is loaded at once and they take turns, request by request (the turn group):
a one-stream ratio compares engines timed over the same minutes, so host drift cancels (run one after
another, the same engine has measured up to 14% apart). Standard and fast also run alone at 4 and 16
concurrent streams. Greedy outputs of fast and standard are compared token by token (float32: lossless
means identical). The arithmetic and the table are :mod:`bench.fast_report`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from bench import RESULTS_DIR
from bench.engine_process import run_engine_process
from bench.fast_engine import ABORT_FILE
from bench.fast_report import fastest_k, summarise, write_result
from bench.recording import StageCheckpoint
from distill.prompts import load_prompts
from infra.cpu_engine import intel_openmp_library
from infra.errors import TandemError
from infra.registry import open_registry

log = logging.getLogger(__name__)


DEFAULT_TEACHER = "smollm2-135m-instruct@base"


#: Where the oracle proposer (bench.oracle, TANDEM_ORACLE_FILE) finds the standard tier's greedy answers.
ORACLE_FILE = "oracle.json"
#: KV cache of each engine of the turn group: one stream of 2,048 tokens needs ~100 MB in float32.
TURN_KV_CACHE_BYTES = 256 << 20

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
        description="k values timed in the one-stream turn group; the fastest is the k of the reported ratio "
        "and of the multi-stream runs. The head records k from an offline cost model; this measures it. "
        "Ignored when k is given.",
    )
    compare: list[str] = Field(
        default_factory=list,
        description="Further EAGLE-3 heads (registry refs or directories) timed in the one-stream turn group "
        "at every k: a paired comparison of training rounds, free of the drift between two runs.",
    )
    streams: list[int] = Field(
        default_factory=lambda: [1, 4, 16],
        description="Concurrency levels; 1 is required (the tuning variants and every ratio start there).",
    )
    requests_per_stream: int = Field(2, ge=1, description="Requests per stream at >1 streams.")
    single_requests: int = Field(
        12,
        ge=2,
        description="One-stream requests per engine. The turn group loads every one-stream engine at once "
        "and sends them one request at a time, engine after engine, so all are timed over the same stretch "
        "of a drifting host; the ratio's 90% interval resamples these prompts.",
    )
    max_tokens: int = Field(128, ge=8)
    turn_group_size: int = Field(
        4,
        ge=2,
        description="Engines loaded at once in a one-stream turn group, its standard engine included; more "
        "one-stream engines make more groups, each with a standard engine of its own. A float32 engine of "
        "the bundled model holds ~3.5 GB, so 4 fit beside the rest of a 24 GiB host.",
    )
    turn_pause_s: float = Field(
        0.1,
        ge=0.0,
        description="Pause before each turn, after the engine's processes resume. The other engines' "
        "processes are stopped (SIGSTOP) outside their turns: before, an idle vLLM worker busy-looped on its "
        "shared-memory queue for 1 s after its last step and took a core from the engine whose turn it was.",
    )
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

    @field_validator("streams")
    @classmethod
    def _one_stream_first(cls, streams: list[int]) -> list[int]:
        if 1 not in streams or min(streams) < 1:
            raise ValueError("streams must include 1 and be positive")
        return sorted(set(streams))


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


def _run_engines_together(
    specs: list[tuple[str, dict[str, Any]]],
    env: dict[str, str],
    timeout_s: int,
    *,
    take_turns: bool,
    pause_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Engine processes at once, one per (label, spec), timing from a common start (a barrier after every
    engine's warm-up). ``take_turns``: their one-stream requests go one at a time across the group, engine
    after engine (:mod:`bench.fast_engine`). If one engine fails, the others are told to give up."""
    from concurrent.futures import Future, ThreadPoolExecutor

    with tempfile.TemporaryDirectory(prefix="tandem-bench-group-") as scratch:

        def joined(party: int, spec: dict[str, Any]) -> dict[str, Any]:
            group = {"start_barrier": {"dir": f"{scratch}/barrier", "parties": len(specs)}}
            if take_turns:
                group["turns"] = {
                    "dir": f"{scratch}/turns",
                    "party": party,
                    "parties": len(specs),
                    "settle_s": pause_s,
                }
            return {**spec, **group}

        def abort_on_failure(future: Future[dict[str, Any]]) -> None:
            if future.exception() is not None:
                (Path(scratch) / ABORT_FILE).touch()

        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            futures = []
            for party, (label, spec) in enumerate(specs):
                future = pool.submit(_run_engine, joined(party, spec), label, env, timeout_s)
                future.add_done_callback(abort_on_failure)
                futures.append(future)
            return [future.result() for future in futures]


def _run_turn_groups(
    speculative: dict[str, dict[str, Any]],
    standard: dict[str, Any],
    env: dict[str, str],
    config: FastBenchConfig,
    say: Callable[[str], None],
    checkpoint: StageCheckpoint,
) -> dict[str, Any]:
    """The one-stream engines (speculative configs by label) in groups of ``config.turn_group_size``, each
    group with a standard engine (spec ``standard``) of its own, taking turns: ``{"groups": [...]}``. Each
    finished group is a stage of ``checkpoint``."""
    labels, size = list(speculative), config.turn_group_size - 1
    groups = [labels[i : i + size] for i in range(0, len(labels), size)]
    results = []
    for number, members in enumerate(groups, 1):
        say(f"one stream, turn group {number}/{len(groups)}: standard, {', '.join(members)}")
        specs = [("standard", standard)]
        specs += [
            (label, {**standard, "engine": {**standard["engine"], "speculative_config": speculative[label]}})
            for label in members
        ]
        together = checkpoint.run(
            f"turn group: standard, {', '.join(members)}",
            functools.partial(
                _run_engines_together,
                specs,
                env,
                config.engine_timeout_s,
                take_turns=True,
                pause_s=config.turn_pause_s,
            ),
        )
        results.append({label: run for (label, _), run in zip(specs, together, strict=True)})
    return {"groups": results}


def _run_standard_engines(
    config: FastBenchConfig,
    base: dict[str, Any],
    engine: dict[str, Any],
    phases: list[dict[str, Any]],
    checkpoint: StageCheckpoint,
    say: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """The standard tier alone per tuning variant (``standard[<variant>]``, every phase), then two standard
    engines decoding at once per ``config.shared_host`` variant (``shared[<variant>]``, one stream each);
    each run is a stage of ``checkpoint``."""
    runs: dict[str, dict[str, Any]] = {}
    for variant in config.variants:
        say(f"standard engine ({variant})")
        variant_env, variant_engine = variant_settings(variant)
        runs[f"standard[{variant}]"] = checkpoint.run(
            f"standard[{variant}]",
            functools.partial(
                _run_engine,
                {**base, "engine": {**engine, **variant_engine}, "phases": phases},
                f"standard-{variant}",
                variant_env,
                config.engine_timeout_s,
            ),
        )
    for variant in config.shared_host:
        say(f"two standard engines at once ({variant}, one stream each)")
        shared_env, shared_engine = variant_settings(variant)
        shared = {**base, "engine": {**engine, **shared_engine}, "phases": [phases[0]]}
        runs[f"shared[{variant}]"] = {
            "engines": checkpoint.run(
                f"shared[{variant}]",
                functools.partial(
                    _run_engines_together,
                    [(f"shared-{variant}-{i}", shared) for i in range(2)],
                    shared_env,
                    config.engine_timeout_s,
                    take_turns=False,
                ),
            )
        }
    return runs


def _reference_engines(
    config: FastBenchConfig,
    standard: dict[str, Any],
    prompts: list[list[int]],
    draft_dir: Path,
    k: int,
    scratch: Path,
) -> dict[str, dict[str, Any]]:
    """Speculative configs of the turn group's reference engines, by label: the oracle ceiling at each k
    (replaying ``standard``'s own one-stream greedy answers, written to ``scratch/ORACLE_FILE``), an
    untrained head of the draft's shape (the true cost of drafting) and n-gram prompt lookup at ``k``."""
    from distill.eagle3.head import Eagle3Head

    engines: dict[str, dict[str, Any]] = {}
    if config.oracle_ks:
        answers = standard["phases"]["1"]["requests"]
        (scratch / ORACLE_FILE).write_text(
            json.dumps([ids + r["token_ids"] for ids, r in zip(prompts, answers, strict=False)])
        )
        for n in config.oracle_ks:
            engines[f"oracle k{n}"] = {
                "method": "custom_class",
                "model": "bench.oracle.OracleProposer",
                "num_speculative_tokens": n,
            }
    if config.untrained:
        head = Eagle3Head.load_vllm(draft_dir)
        fresh = Eagle3Head(head.shape)
        fresh.d2t.copy_(head.d2t)
        fresh.t2d.copy_(head.t2d)
        fresh.save_vllm(scratch / "untrained")
        engines["untrained"] = {
            "method": "eagle3",
            "model": str(scratch / "untrained"),
            "num_speculative_tokens": k,
        }
    if config.ngram:
        engines["ngram"] = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    return engines


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


def run_fast_bench(
    config: FastBenchConfig, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Measure every engine of the module docstring; write ``fast-<time>.json`` + ``fast-latest.json``."""
    from distill.eagle3.head import is_eagle3_dir
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
    k = reference_k = int(config.num_speculative_tokens or recorded_k or 3)
    checkpoint = StageCheckpoint(
        config.results_dir,
        "fast",
        {
            "config": config.model_dump(mode="json", exclude={"results_dir", "engine_timeout_s"}),
            "draft": draft_ref,
            "compare": [ref for _, ref in compared],
        },
    )
    resumed = list(checkpoint.stages)
    if resumed:
        say(f"resuming {checkpoint.path.name}: {', '.join(resumed)} already measured")

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
    one_stream = phases[0]  # streams are sorted and include 1
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
    runs = _run_standard_engines(config, base, engine, phases, checkpoint, say)
    best_variant = max(config.variants, key=lambda v: runs[f"standard[{v}]"]["phases"]["1"]["tokens_per_s"])
    env, best_engine = variant_settings(best_variant)
    engine = {**engine, **best_engine}
    ks = [k] if config.num_speculative_tokens or not config.k_sweep else list(config.k_sweep)

    def eagle_config(head: Path, n: int) -> dict[str, Any]:
        return {"method": "eagle3", "model": str(head), "num_speculative_tokens": n}

    with tempfile.TemporaryDirectory(prefix="tandem-bench-turns-") as scratch:
        speculative: dict[str, dict[str, Any]] = {f"k{n}": eagle_config(draft_dir, n) for n in ks}
        speculative.update(
            {f"compare {ref} k{n}": eagle_config(head, n) for head, ref in compared for n in ks}
        )
        speculative.update(
            _reference_engines(
                config, runs[f"standard[{best_variant}]"], prompts, draft_dir, reference_k, Path(scratch)
            )
        )
        runs["turns"] = _run_turn_groups(
            speculative,
            {
                **base,
                "engine": {**engine, "kv_cache_memory_bytes": TURN_KV_CACHE_BYTES},
                "phases": [one_stream],
            },
            {**env, "TANDEM_ORACLE_FILE": str(Path(scratch) / ORACLE_FILE)},
            config,
            say,
            checkpoint,
        )
        k = fastest_k(runs["turns"])
    more = phases[1:]
    if more:
        say(
            f"fast engine (eagle3, k={k}, {best_variant}) at {', '.join(str(p['streams']) for p in more)} streams"
        )
        runs["fast"] = checkpoint.run(
            f"fast k{k}",
            functools.partial(
                _run_engine,
                {
                    **base,
                    "engine": {**engine, "speculative_config": eagle_config(draft_dir, k)},
                    "phases": more,
                },
                "fast",
                env,
                config.engine_timeout_s,
            ),
        )

    summary = summarise(runs, best_variant, k, untrained_k=reference_k)
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
            # The tuning target is the standard tier alone on the host.
            "standard_tpot_over_bound": round(
                summary["variants"][best_variant]["1"]["tpot_p50_ms"] / bound_ms, 3
            ),
            "measured_at": datetime.now(UTC).isoformat(),
            "bench_seconds": round(time.perf_counter() - started, 1),
            # The CPU is shared: how busy it was bounds how far timings can be trusted.
            "load_average_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "cpu_count": os.cpu_count(),
            "command": "tandem bench fast",
            # Stages measured by an earlier, interrupted run of the same configuration.
            "resumed_stages": resumed,
        }
    )
    draft_report = draft_dir / "eagle3_report.json"
    if draft_report.is_file():
        offline = json.loads(draft_report.read_text())
        summary["offline_acceptance"] = offline.get("acceptance")
        summary["train_completion_tokens"] = offline.get("train_completion_tokens")
    write_result(summary, config.results_dir)
    checkpoint.finish()
    return summary
