from __future__ import annotations

from typing import Any

import pytest

from bench.context import (
    ContextBenchConfig,
    ContextBenchError,
    best_chunk,
    gap_stats,
    markdown_table,
    percentile,
    summarise_variant,
    token_gaps,
    variant_engine_args,
    variant_names,
)


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0


def test_token_gaps_skip_the_first_token_and_share_coalesced_gaps() -> None:
    gaps = token_gaps([1.0, 1.01, 1.03, 1.07, 1.07])
    assert [end for end, _ in gaps] == [1.01, 1.03, 1.07, 1.07]
    assert [round(gap, 4) for _, gap in gaps] == [0.01, 0.02, 0.02, 0.02]
    assert token_gaps([]) == [] and token_gaps([2.0]) == []


def test_gap_stats_p99_sees_the_few_long_gaps() -> None:
    # 2% of the gaps are 2 s stalls: the median stays at 10 ms, the p99 lands on a stall.
    stats = gap_stats([0.010] * 980 + [2.0] * 20)
    assert stats["count"] == 1000 and stats["p50_ms"] == 10.0
    assert stats["p99_ms"] > 1000 and stats["max_ms"] == 2000.0
    assert gap_stats([])["p99_ms"] is None


def _phase(arrivals: list[list[float]], **long: float) -> dict[str, Any]:
    return {"arrivals": arrivals, **long}


def test_summarise_variant_counts_only_gaps_while_the_long_prompt_is_in_flight() -> None:
    steady = [i * 0.01 for i in range(50)]
    # Loaded: steady 10 ms, then one 500 ms stall after the long prompt is submitted at 0.1 s.
    stalled = [i * 0.01 for i in range(11)] + [0.6 + i * 0.01 for i in range(40)]
    run = {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 8192,
        "engine_start_s": 12.34,
        "unloaded": [_phase([steady, steady])],
        "loaded": [_phase([stalled, stalled], long_submitted_s=0.1, long_first_token_s=0.6, long_done_s=0.8)],
    }
    summary = summarise_variant(run)
    assert summary["unloaded"]["p99_ms"] == pytest.approx(10.0)
    # Gaps ending in (0.1, 0.8]: one stall + 20 steady per stream.
    assert summary["loaded"]["count"] == 2 * 21
    assert summary["loaded"]["max_ms"] == pytest.approx(500.0)
    assert summary["loaded_during_prefill"]["count"] == 2
    assert summary["ratio"] > 2 and summary["long_ttft_s"] == 0.5
    assert summary["streams_outlived_long_prompt"] is True


def _variant(chunked: bool, tokens: int, loaded_p99: float, ratio: float) -> dict[str, Any]:
    return {
        "enable_chunked_prefill": chunked,
        "max_num_batched_tokens": tokens,
        "unloaded": {"p99_ms": loaded_p99 / ratio},
        "loaded": {"p99_ms": loaded_p99, "max_ms": loaded_p99 * 1.5},
        "ratio": ratio,
        "long_ttft_s": 9.0,
    }


def test_best_chunk_is_the_lowest_loaded_p99_that_meets_the_target() -> None:
    variants = {
        "off": _variant(False, 8192, 30.0, 1.5),  # chunked prefill off never counts as a chunk size
        "chunk-256": _variant(True, 256, 40.0, 1.9),
        "chunk-512": _variant(True, 512, 35.0, 1.99),
        "chunk-1024": _variant(True, 1024, 20.0, 2.5),
    }
    assert best_chunk(variants, 2.0) == "chunk-512"
    assert best_chunk(variants, 1.0) is None


def test_markdown_table_names_the_best_chunk_or_says_none_met() -> None:
    variants = {"off": _variant(False, 8192, 900.0, 45.0), "chunk-512": _variant(True, 512, 30.0, 1.5)}
    summary = {
        "variants": variants,
        "best_variant": "chunk-512",
        "lowest_ratio_variant": "chunk-512",
        "target_ratio": 2.0,
        "streams": 8,
        "max_tokens": 64,
        "long_tokens": 8000,
        "model": "m",
        "dtype": "float32",
    }
    table = markdown_table(summary)
    assert "| off | off | 8192 | 20.0 | 900.0 | 45.0 | 1350.0 | 9.0 |" in table
    assert "best chunk size: **512** (chunk-512)" in table
    table = markdown_table({**summary, "best_variant": None})
    assert "no chunked variant meets ratio <= 2.0; lowest ratio: chunk-512" in table


def test_variants_and_their_engine_arguments() -> None:
    config = ContextBenchConfig(chunks=[256, 1024])
    assert variant_names(config) == ["off", "chunk-256", "chunk-1024", "vllm-default"]
    assert variant_engine_args("off", 8192) == {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 8192,
    }
    assert variant_engine_args("chunk-256", 8192) == {
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 256,
    }
    assert variant_engine_args("vllm-default", 8192) == {}
    with pytest.raises(ContextBenchError, match="unknown variant"):
        variant_engine_args("chunk-big", 8192)
    with pytest.raises(ValueError, match="short_prompt_tokens"):
        ContextBenchConfig(short_prompt_tokens=(100, 40))
