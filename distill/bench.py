"""``run_fast_bench``: the fast tier (speculative, distilled draft) against the standard tier, measured with vLLM.

Engines run one after another, each in its own process (``distill.bench_engine``), on the same chat
prompts: standard (plain engine) vs fast (same weights + ``speculative_config`` with the draft), in bf16
for speed at 1 and N streams, optionally with the undistilled layer-subset draft for online acceptance
before distillation, and in float32 for the lossless check (greedy outputs must be token-identical).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from distill.api import REPORT_NAME, latest_draft_for
from distill.draft_init import build_layer_subset_draft
from distill.errors import DistillError
from distill.prompts import load_prompts
from distill.speculation import choose_num_speculative_tokens
from infra.registry import open_registry

log = logging.getLogger(__name__)

DEFAULT_TEACHER = "smollm2-135m-instruct@base"
RESULTS_DIR = Path("bench/results")


def _run_engine(spec: dict[str, Any], label: str, timeout_s: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tandem-fast-bench-") as scratch:
        spec_path, result_path = Path(scratch) / "spec.json", Path(scratch) / "result.json"
        spec_path.write_text(json.dumps(spec))
        log.info(
            "event=fast_bench_engine label=%s speculative=%s dtype=%s",
            label,
            bool(spec.get("speculative_config")),
            spec["dtype"],
        )
        completed = subprocess.run(
            [sys.executable, "-m", "distill.bench_engine", str(spec_path), str(result_path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")},
        )
        if completed.returncode != 0 or not result_path.is_file():
            raise DistillError(
                f"vLLM engine '{label}' failed (exit {completed.returncode}): {completed.stderr[-3000:]}"
            )
        return dict(json.loads(result_path.read_text()))


def _chat_token_ids(model_dir: Path, prompts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = []
    for prompt in prompts:
        ids: Any = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        rows.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return rows


def _compare_tokens(reference: list[list[int]], candidate: list[list[int]]) -> dict[str, Any]:
    identical = sum(a == b for a, b in zip(reference, candidate, strict=True))
    first_mismatch = [
        {
            "prompt": i,
            "position": next(
                (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
            ),
        }
        for i, (a, b) in enumerate(zip(reference, candidate, strict=True))
        if a != b
    ]
    return {
        "identical": identical,
        "total": len(reference),
        "lossless": identical == len(reference),
        "mismatches": first_mismatch,
    }


def run_fast_bench(
    *,
    teacher_ref: str = DEFAULT_TEACHER,
    draft_ref: str | None = None,
    registry_url: str | None = None,
    num_speculative_tokens: int | None = None,
    streams: int = 16,
    single_stream_requests: int = 8,
    multi_stream_requests: int = 32,
    max_tokens: int = 128,
    include_undistilled: bool = True,
    lossless_requests: int = 20,
    lossless_tokens: int = 64,
    results_dir: Path = RESULTS_DIR,
    engine_timeout_s: int = 900,
) -> dict[str, Any]:
    """Measure standard vs fast tier with vLLM on held-out prompts; print a table and write JSON.

    Returns the summary (tokens/s and their ratio at 1 and ``streams`` streams, online acceptance from
    vLLM's spec-decode counters before and after distillation, offline acceptance from the draft's
    report, the k used, the cost ratio implied by the timings, and the float32 lossless check).
    """
    registry = open_registry(registry_url)
    teacher_manifest = registry.manifest(teacher_ref)
    teacher_dir = registry.fetch(teacher_manifest.ref)
    draft_manifest = (
        registry.manifest(draft_ref) if draft_ref else latest_draft_for(registry, teacher_manifest.ref)
    )
    if draft_manifest is None:
        raise DistillError(
            f"no draft for {teacher_manifest.ref} in {registry.url}: run `tandem distill` first"
        )
    draft_dir = registry.fetch(draft_manifest.ref)
    k = int(num_speculative_tokens or draft_manifest.metadata.get("num_speculative_tokens", 3))
    report_path = draft_dir / REPORT_NAME
    offline = json.loads(report_path.read_text()) if report_path.is_file() else {}

    prompts = load_prompts(split="heldout")
    needed = max(single_stream_requests, multi_stream_requests, lossless_requests)
    token_ids = _chat_token_ids(teacher_dir, (prompts * (needed // len(prompts) + 1))[:needed])
    speed_phases = [
        {"name": "single", "streams": 1, "prompts": single_stream_requests},
        {"name": "multi", "streams": streams, "prompts": multi_stream_requests},
    ]
    base = {"model": str(teacher_dir), "prompts": token_ids, "max_tokens": max_tokens}

    def speculative(model: Path) -> dict[str, Any]:
        return {"method": "draft_model", "model": str(model), "num_speculative_tokens": k}

    started = time.perf_counter()
    load_before = os.getloadavg()
    runs: dict[str, dict[str, Any]] = {}
    runs["standard"] = _run_engine(
        {**base, "dtype": "bfloat16", "phases": speed_phases}, "standard", engine_timeout_s
    )
    runs["fast"] = _run_engine(
        {**base, "dtype": "bfloat16", "phases": speed_phases, "speculative_config": speculative(draft_dir)},
        "fast",
        engine_timeout_s,
    )
    keep_layers = draft_manifest.metadata.get("keep_layers")
    if include_undistilled and keep_layers:
        with tempfile.TemporaryDirectory(prefix="tandem-undistilled-") as scratch:
            undistilled = build_layer_subset_draft(teacher_dir, Path(scratch) / "draft", list(keep_layers))
            runs["fast_undistilled"] = _run_engine(
                {
                    **base,
                    "dtype": "bfloat16",
                    "phases": speed_phases[:1],
                    "speculative_config": speculative(undistilled),
                },
                "fast-undistilled",
                engine_timeout_s,
            )
    lossless_phase = [
        {
            "name": "lossless",
            "streams": lossless_requests,
            "prompts": lossless_requests,
            "max_tokens": lossless_tokens,
        }
    ]
    if lossless_requests:
        runs["standard_fp32"] = _run_engine(
            {**base, "dtype": "float32", "phases": lossless_phase}, "standard-fp32", engine_timeout_s
        )
        runs["fast_fp32"] = _run_engine(
            {
                **base,
                "dtype": "float32",
                "phases": lossless_phase,
                "speculative_config": speculative(draft_dir),
            },
            "fast-fp32",
            engine_timeout_s,
        )

    summary = _summarise(runs, k, offline, streams)
    summary.update(
        {
            "teacher": teacher_manifest.ref,
            "draft": draft_manifest.ref,
            "num_speculative_tokens": k,
            "max_tokens": max_tokens,
            "measured_at": datetime.now(UTC).isoformat(),
            "bench_seconds": round(time.perf_counter() - started, 1),
            # The CPU is shared: record how busy it was, since it bounds how far timings can be trusted.
            "load_average_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "cpu_count": os.cpu_count(),
            "engines": {name: _without_token_ids(run) for name, run in runs.items()},
        }
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / "distill_fast_bench.json"
    path.write_text(json.dumps(summary, indent=2))
    summary["results_file"] = str(path)
    _print_table(summary)
    return summary


def _summarise(
    runs: dict[str, dict[str, Any]], k: int, offline: dict[str, Any], streams: int
) -> dict[str, Any]:
    standard, fast = runs["standard"]["phases"], runs["fast"]["phases"]
    summary: dict[str, Any] = {}
    for phase, label in (("single", "1_stream"), ("multi", f"{streams}_streams")):
        summary[f"standard_tokens_per_s_{label}"] = round(standard[phase]["tokens_per_s"], 2)
        summary[f"fast_tokens_per_s_{label}"] = round(fast[phase]["tokens_per_s"], 2)
        summary[f"speedup_{label}"] = round(fast[phase]["tokens_per_s"] / standard[phase]["tokens_per_s"], 3)
    online = fast["single"]["spec_decode"] or {}
    summary["online_acceptance_after"] = online.get("acceptance_rate")
    summary["online_mean_acceptance_length"] = online.get("mean_acceptance_length")
    summary["online_accepted_per_position"] = (
        [
            round(n / online["spec_decode_num_drafts"], 4)
            for n in online.get("num_accepted_tokens_per_pos", [])
        ]
        if online.get("spec_decode_num_drafts")
        else []
    )
    if "fast_undistilled" in runs:
        before = runs["fast_undistilled"]["phases"]["single"]
        summary["online_acceptance_before"] = (before["spec_decode"] or {}).get("acceptance_rate")
        summary["speedup_1_stream_undistilled"] = round(
            before["tokens_per_s"] / standard["single"]["tokens_per_s"], 3
        )
    length = online.get("mean_acceptance_length")
    if length:
        # Single-stream step model: fast/standard = E[tokens per step] / (1 + k c)  =>  c.
        ratio = fast["single"]["tokens_per_s"] / standard["single"]["tokens_per_s"]
        summary["cost_ratio_online"] = round((length / ratio - 1) / k, 4)
        rate = online.get("acceptance_rate") or 0.0
        summary["k_choice_online"] = choose_num_speculative_tokens(
            min(rate, 0.999), max(summary["cost_ratio_online"], 0.0)
        ).model_dump()
    if offline:
        summary["offline_acceptance_before"] = offline["acceptance_before"]
        summary["offline_acceptance_after"] = offline["acceptance_after"]
        summary["cost_ratio_offline"] = offline.get("cost_ratio")
    if "fast_fp32" in runs:
        summary["lossless_fp32"] = _compare_tokens(
            runs["standard_fp32"]["phases"]["lossless"]["token_ids"],
            runs["fast_fp32"]["phases"]["lossless"]["token_ids"],
        )
    return summary


def _without_token_ids(run: dict[str, Any]) -> dict[str, Any]:
    phases = {
        name: {k: v for k, v in phase.items() if k != "token_ids"} for name, phase in run["phases"].items()
    }
    return {**run, "phases": phases}


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fast tier bench: {summary['draft']} (k={summary['num_speculative_tokens']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key in {
            "engines",
            "k_choice_online",
            "offline_acceptance_before",
            "offline_acceptance_after",
            "lossless_fp32",
        }:
            continue
        table.add_row(key, json.dumps(value) if isinstance(value, list | dict) else str(value))
    for key in ("offline_acceptance_before", "offline_acceptance_after"):
        if key in summary:
            table.add_row(
                key,
                f"E[min(p,q)]={summary[key]['expected_acceptance']:.4f} greedy={summary[key]['greedy_agreement']:.4f}",
            )
    if "lossless_fp32" in summary:
        check = summary["lossless_fp32"]
        table.add_row("lossless_fp32", f"{check['identical']}/{check['total']} identical")
    Console().print(table)
