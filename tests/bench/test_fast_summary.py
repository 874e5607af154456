"""`tandem bench fast`'s arithmetic on recorded engine runs: speedups against the best-tuned standard tier,
the measured k sweep, the cost ratio from the untrained head, greedy identity and the README table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bench.fast import markdown_table, summarise
from bench.fast_engine import wait_for_peers


def _phase(
    streams: int, tokens_per_s: float, outputs: list[list[int]], length: float | None = None
) -> dict[str, Any]:
    phase: dict[str, Any] = {
        "streams": streams,
        "tokens_per_s": tokens_per_s,
        "generated_tokens": sum(map(len, outputs)),
        "requests": [{"tpot_s": 0.03, "ttft_s": 0.1, "token_ids": ids} for ids in outputs],
    }
    if length is not None:
        phase["spec_decode"] = {
            "acceptance_rate": (length - 1) / 2,
            "mean_acceptance_length": length,
            "accepted_per_position": [0.5, 0.2],
        }
    return phase


def _run(**phases: dict[str, Any]) -> dict[str, Any]:
    return {"engine_start_s": 10.0, "phases": phases}


def test_k_sweep_speedups_identity_and_table() -> None:
    greedy = [[1, 2, 3], [4, 5, 6]]
    runs = {
        "standard[iomp]": _run(**{"1": _phase(1, 20.0, greedy), "4": _phase(4, 60.0, greedy)}),
        "sweep-k2": _run(**{"1": _phase(1, 34.0, greedy, 1.7)}),
        "sweep-k3": _run(**{"1": _phase(1, 37.0, [[1, 2, 3], [4, 5, 7]], 1.8)}),
        "fast": _run(**{"1": _phase(1, 36.0, greedy, 1.8), "4": _phase(4, 54.0, greedy, 1.8)}),
        "untrained": _run(**{"1": _phase(1, 18.0, greedy, 1.0)}),
        "oracle-k3": _run(**{"1": _phase(1, 80.0, greedy, 4.0)}),
    }
    summary = summarise(runs, "iomp", 3)
    assert summary["speedup"] == {"1": 1.8, "4": 0.9}
    assert summary["crossover_streams"] == 4
    assert summary["k_sweep"]["2"]["speedup"] == 1.7 and summary["k_sweep"]["3"]["speedup"] == 1.85
    assert summary["k_sweep"]["2"]["lossless"]["lossless"] is True
    assert summary["k_sweep"]["3"]["lossless"] == {"identical": 1, "total": 2, "lossless": False}
    assert summary["cost_ratio_c"] == round((1.0 / 0.9 - 1) / 3, 4)
    assert summary["oracle_ceiling_speedup"] == 4.0 and summary["fraction_of_ceiling"] == 0.45
    table = markdown_table({**summary, "tuning_variant": "iomp", "num_speculative_tokens": 3})
    assert "| fast (eagle3, k=3) | 1 | 36.0 | 30.0 | **1.8** |" in table
    assert "| k sweep: eagle3 k=2 | 1 | 34.0 | 30.0 | 1.7 |" in table
    assert "| oracle ceiling k=3 | 1 | 80.0 |" in table and "| untrained | 1 | 18.0 |" in table


def test_bracketed_baseline_and_compared_heads() -> None:
    greedy = [[1, 2, 3], [4, 5, 6]]
    runs = {
        "standard[iomp]": _run(**{"1": _phase(1, 20.0, greedy), "4": _phase(4, 60.0, greedy)}),
        "fast": _run(**{"1": _phase(1, 33.0, greedy, 1.8), "4": _phase(4, 66.0, greedy, 1.8)}),
        "compare[head@r3]": _run(**{"1": _phase(1, 27.5, [[1, 2, 3], [4, 5, 0]], 1.6)}),
        "standard-again": _run(**{"1": _phase(1, 24.0, greedy)}),
    }
    summary = summarise(runs, "iomp", 3)
    # One stream: fast against the mean of the standard timings before and after (22 tok/s).
    assert summary["speedup"] == {"1": 1.5, "4": 1.1}
    assert summary["standard_bracket"]["drift"] == 0.2
    assert summary["standard_bracket"]["lossless"]["lossless"] is True
    assert summary["compare"]["head@r3"]["speedup"] == 1.25
    assert summary["compare"]["head@r3"]["lossless"]["lossless"] is False
    table = markdown_table({**summary, "tuning_variant": "iomp", "num_speculative_tokens": 3})
    assert "| standard again, after the fast runs (drift +20.0%) | 1 | 24.0 |" in table
    assert "| compared head head@r3 (k=3) | 1 | 27.5 | 30.0 | 1.25 |" in table


def test_shared_host_pairs_and_other_variants_reach_the_summary_and_table() -> None:
    greedy = [[1, 2, 3], [4, 5, 6]]
    runs = {
        "standard[iomp]": _run(**{"1": _phase(1, 20.0, greedy)}),
        "standard[iomp-allcores]": _run(**{"1": _phase(1, 26.0, greedy)}),
        "shared[iomp]": {
            "engines": [_run(**{"1": _phase(1, 9.0, greedy)}), _run(**{"1": _phase(1, 9.5, greedy)})]
        },
        "shared[iomp-allcores]": {
            "engines": [_run(**{"1": _phase(1, 11.25, greedy)}), _run(**{"1": _phase(1, 11.5, greedy)})]
        },
        "fast": _run(**{"1": _phase(1, 39.0, greedy, 1.8)}),
    }
    summary = summarise(runs, "iomp-allcores", 3)
    assert summary["speedup"] == {"1": 1.5}
    assert summary["shared_host"]["iomp"] == {
        "tokens_per_s": [9.0, 9.5],
        "total_tokens_per_s": 18.5,
        "tpot_p50_ms": [30.0, 30.0],
        "alone_tokens_per_s": 20.0,
    }
    assert summary["shared_host"]["iomp-allcores"]["total_tokens_per_s"] == 22.75
    assert "shared[iomp]" not in summary["engine_start_s"]
    table = markdown_table(
        {
            **summary,
            "tuning_variant": "iomp-allcores",
            "num_speculative_tokens": 3,
            "standard_tpot_over_bound": 1.9,
            "bandwidth_bound_tpot_ms": 17.3,
            "memory_bandwidth_gbps": 31.2,
        }
    )
    assert "| standard, tuning variant iomp | 1 | 20.0 | 30.0 |" in table
    assert "standard, tuning variant iomp-allcores |" not in table  # the baseline has its own rows
    assert "| two standard engines at once (iomp-allcores), each | 1 + 1 | 11.25 + 11.5 = 22.75 |" in table
    assert "bandwidth bound: **1.9** (bound 17.3 ms" in table


def test_paired_engines_start_timing_together_or_fail_clearly(tmp_path: Path) -> None:
    async def both() -> None:
        await asyncio.gather(wait_for_peers(tmp_path / "pair", 2), wait_for_peers(tmp_path / "pair", 2))

    asyncio.run(both())
    assert len(list((tmp_path / "pair").glob("ready-*"))) == 2
    with pytest.raises(TimeoutError, match="only 1 of 2 engines became ready"):
        asyncio.run(wait_for_peers(tmp_path / "alone", 2, timeout_s=0.2))
