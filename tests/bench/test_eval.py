from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.eval import run_eval_bench
from evalsuite.registry import family_names
from evalsuite.sandbox import bwrap_available


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (bwrap) not usable here")
def test_bench_writes_latency_and_throughput(tmp_path: Path) -> None:
    result = run_eval_bench(concurrency=2, sandboxes=4, samples_per_family=1, output_dir=tmp_path)
    # One sample of every registered family (a new family adds one).
    assert result["suite"]["samples"] == len(family_names()) and result["suite"]["samples_per_s"] > 0
    total = result["sandbox_latency"]["total"]
    assert 0 < total["p50_ms"] <= total["p95_ms"]
    assert json.loads((tmp_path / "eval-latest.json").read_text())["concurrency"] == 2
