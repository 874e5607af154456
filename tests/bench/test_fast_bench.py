"""`tandem bench fast` end to end on a tiny random Llama and a head of its shape: every one-stream engine is
loaded at once and they take turns; the oracle's drafts are all accepted, every engine's greedy output is
the standard engine's, and the result file and table are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.fast import FastBenchConfig, run_fast_bench
from bench.tiny_model import build_tiny_llama
from infra.registry import FileRegistry


@pytest.mark.integration
@pytest.mark.slow
def test_every_one_stream_engine_takes_turns_and_agrees_with_the_standard_tier(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from distill.eagle3.training import new_head

    registry = FileRegistry(tmp_path / "registry")
    target = build_tiny_llama(tmp_path / "target", layers=4)
    registry.publish(target, "tiny", "v1", kind="model")
    torch.manual_seed(0)
    head = new_head(AutoConfig.from_pretrained(target), torch.arange(512), None)
    head.save_vllm(tmp_path / "head")

    config = FastBenchConfig(
        teacher="tiny@v1",
        draft=str(tmp_path / "head"),
        registry_url=str(tmp_path / "registry"),
        k_sweep=[2, 3],
        streams=[1],
        turn_group_size=3,
        single_requests=2,
        max_tokens=16,
        oracle_ks=[3],
        ngram=False,
        variants=["iomp"],
        shared_host=[],
        kv_cache_memory_bytes=128 << 20,
        results_dir=tmp_path / "results",
    )
    stages: list[str] = []
    summary = run_fast_bench(config, progress=stages.append)

    # Three engines at once: the standard engine with two others each time.
    assert "one stream, turn group 1/2: standard, k2, k3" in stages, stages
    assert "one stream, turn group 2/2: standard, oracle k3, untrained" in stages, stages
    turns = summary["in_turns"]
    assert len(summary["in_turns_standard_tokens_per_s"]) == 2
    assert set(turns) == {"standard", "k2", "k3", "oracle k3", "untrained"}
    for label, entry in turns.items():
        assert entry["generated_tokens"] > 0, label
        if label != "standard":
            assert entry["lossless"]["lossless"], (label, entry["lossless"])
            low, high = entry["speedup_interval_90"]
            assert low <= high
    # The oracle replays the standard engine's own answers, written before the group started.
    assert turns["oracle k3"]["acceptance_rate"] > 0.9, turns["oracle k3"]
    assert summary["num_speculative_tokens"] in (2, 3)
    assert summary["speedup"]["1"] == turns[f"k{summary['num_speculative_tokens']}"]["speedup"]
    assert summary["lossless"]["1"]["lossless"]
    assert (
        json.loads((tmp_path / "results" / "fast-latest.json").read_text())["in_turns"].keys() == turns.keys()
    )
    assert "in turns: oracle ceiling k=3" in (tmp_path / "results" / "fast-latest.md").read_text()
    assert (tmp_path / "results" / "fast-latest.png").stat().st_size > 0
    # Every stage was checkpointed while it ran; the checkpoint goes once the result is written.
    assert summary["resumed_stages"] == []
    assert not list((tmp_path / "results").glob("fast-partial-*.json"))
