"""`tandem bench fast`'s arithmetic on recorded engine runs: one-stream ratios from the turn group (with
their paired interval), the k it picks, the cost ratio from the untrained head, greedy identity, the README
table, and the file protocol by which engines that share the host take turns."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from pydantic import ValidationError

from bench.fast import FastBenchConfig
from bench.fast_engine import ABORT_FILE, _in_turn, pass_turn, wait_for_peers, wait_for_turn
from bench.fast_report import _bar_label, fastest_k, markdown_table, paired_interval, summarise

GREEDY = [[1, 2, 3, 4], [5, 6, 7, 8]]


def _phase(
    streams: int, tokens_per_s: float, outputs: list[list[int]], length: float | None = None
) -> dict[str, Any]:
    """A phase whose requests each took len(ids) / tokens_per_s seconds."""
    phase: dict[str, Any] = {
        "streams": streams,
        "tokens_per_s": tokens_per_s,
        "generated_tokens": sum(map(len, outputs)),
        "requests": [
            {"tpot_s": 0.03, "ttft_s": 0.1, "token_ids": ids, "seconds": len(ids) / tokens_per_s}
            for ids in outputs
        ],
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


def _one(
    tokens_per_s: float, outputs: list[list[int]] = GREEDY, length: float | None = None
) -> dict[str, Any]:
    return _run(**{"1": _phase(1, tokens_per_s, outputs, length)})


def test_turn_group_gives_the_one_stream_ratios_k_ceiling_cost_and_table() -> None:
    turns = {
        "groups": [
            {
                "standard": _one(20.0),
                "k2": _one(34.0, length=1.7),
                "k3": _one(37.0, [[1, 2, 3, 4], [5, 6, 7, 0]], 1.8),
                "compare head@r3 k3": _one(30.0, length=1.6),
            },
            # The host slowed down by the second group: its ratios are against its own standard engine.
            {
                "standard": _one(10.0),
                "k4": _one(18.0, length=1.9),
                "oracle k3": _one(40.0, length=4.0),
                "untrained": _one(9.0, length=1.0),
                "ngram": _one(7.5, length=1.1),
            },
        ]
    }
    runs = {
        # Alone, the standard tier ran at 25 tok/s: the turn group's 20 is the one-stream baseline.
        "standard[iomp]": _run(**{"1": _phase(1, 25.0, GREEDY), "4": _phase(4, 60.0, GREEDY)}),
        "turns": turns,
        "fast": _run(**{"4": _phase(4, 54.0, GREEDY, 1.8)}),
    }
    assert fastest_k(turns) == 3  # k4 decoded faster than k2, but 1.8x its standard is less than 1.85x
    summary = summarise(runs, "iomp", 3, untrained_k=3)
    assert summary["speedup"] == {"1": 1.85, "4": 0.9}
    assert summary["crossover_streams"] == 4
    # Both prompts ran 1.85x faster than the standard engine beside them: no spread.
    assert summary["speedup_interval_90"] == [1.85, 1.85]
    assert summary["k_sweep"]["2"]["speedup"] == 1.7 and summary["k_sweep"]["3"]["speedup"] == 1.85
    assert summary["k_sweep"]["2"]["lossless"]["lossless"] is True
    assert summary["lossless"]["1"] == {"identical": 1, "total": 2, "lossless": False}
    assert summary["compare"]["head@r3 k3"]["speedup"] == 1.5
    assert summary["cost_ratio_c"] == round((1.0 / 0.9 - 1) / 3, 4)
    assert summary["oracle_ceiling_speedup"] == 4.0 and summary["fraction_of_ceiling"] == 0.463
    assert summary["ngram"]["speedup"] == 0.75
    assert summary["standard"]["1"]["tokens_per_s"] == 20.0
    assert summary["in_turns_standard_tokens_per_s"] == [20.0, 10.0]
    assert summary["k_sweep"]["4"] | {"group": 1, "speedup": 1.8} == summary["k_sweep"]["4"]
    assert summary["variants"]["iomp"]["1"]["tokens_per_s"] == 25.0
    table = markdown_table({**summary, "tuning_variant": "iomp", "num_speculative_tokens": 3})
    assert "| fast (eagle3, k=3), in turns | 1 | 37.0 | 30.0 | **1.85** (90%: 1.85-1.85) |" in table
    assert "| standard (iomp), in turns | 1 | 20.0 |" in table
    assert "| standard, tuning variant iomp, alone | 1 | 25.0 |" in table
    assert "| fast (eagle3, k=3) | 4 | 54.0 | 30.0 | **0.9** |" in table
    assert "| in turns: eagle3 k=2 | 1 | 34.0 | 30.0 | 1.7 (1.7-1.7) |" in table
    assert "| in turns: compared head head@r3 k3 | 1 | 30.0 |" in table
    assert "| in turns: oracle ceiling k=3 | 1 | 40.0 |" in table
    assert "| in turns: untrained | 1 | 9.0 |" in table
    assert "ran at 20.0, 10.0 tok/s in groups 1, 2" in table


def test_paired_interval_resamples_prompts_in_pairs() -> None:
    def requests(seconds: list[float]) -> list[dict[str, Any]]:
        return [{"token_ids": [0] * 100, "seconds": s} for s in seconds]

    base = requests([4.0, 4.0, 8.0, 4.0])
    # The same 2x on every prompt, however long each took: no spread.
    assert paired_interval(base, requests([2.0, 2.0, 4.0, 2.0])) == [2.0, 2.0]
    # One prompt where the candidate gains nothing widens the interval around the ratio of sums (~1.6x).
    low, high = paired_interval(base, requests([2.0, 2.0, 8.0, 2.0]))
    assert low < 20 / 14 < high and high <= 2.0
    assert paired_interval(base, requests([2.0, 2.0, 8.0, 2.0])) == [low, high]  # seeded


def test_shared_host_pairs_and_other_variants_reach_the_summary_and_table() -> None:
    runs = {
        "standard[iomp]": _one(20.0),
        "standard[iomp-allcores]": _one(26.0),
        "shared[iomp]": {"engines": [_one(9.0), _one(9.5)]},
        "shared[iomp-allcores]": {"engines": [_one(11.25), _one(11.5)]},
        "turns": {"groups": [{"standard": _one(26.0), "k3": _one(39.0, length=1.8)}]},
    }
    summary = summarise(runs, "iomp-allcores", 3, untrained_k=3)
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
    assert "| standard, tuning variant iomp, alone | 1 | 20.0 | 30.0 |" in table
    assert "| standard, tuning variant iomp-allcores, alone | 1 | 26.0 |" in table
    assert "| two standard engines at once (iomp-allcores), each | 1 + 1 | 11.25 + 11.5 = 22.75 |" in table
    assert "bandwidth bound: **1.9** (bound 17.3 ms" in table


def test_engines_take_turns_request_by_request(tmp_path: Path) -> None:
    order: list[tuple[int, int]] = []

    async def engine(party: int, parties: int = 3, requests: int = 2) -> None:
        for index in range(requests):
            turn = index * parties + party
            await wait_for_turn(tmp_path / "turns", turn)
            order.append((party, index))
            await asyncio.sleep(0.02 * (parties - party))  # the first engine is the slowest
            pass_turn(tmp_path / "turns", turn + 1)

    async def group() -> None:
        await asyncio.gather(engine(2), engine(0), engine(1))

    asyncio.run(group())
    assert order == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]


def test_an_engine_s_processes_are_stopped_outside_its_turns(tmp_path: Path) -> None:
    """The engine (a fake whose 'EngineCore' is a child process) decodes only with its child running; in the
    other party's turns, and after its own last turn until the group is done, the child is stopped."""
    child = subprocess.Popen(["sleep", "60"])
    seen: list[tuple[str, str]] = []

    def state() -> str:
        return "stopped" if psutil.Process(child.pid).status() == psutil.STATUS_STOPPED else "running"

    class Engine:
        async def generate(self, prompt: object, params: object, request_id: str) -> Any:
            seen.append(("own turn", state()))
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2])])

    async def other_party(turns: Path, requests: int) -> None:
        for index in range(requests):
            turn = index * 2 + 1
            await wait_for_turn(turns, turn)
            await asyncio.sleep(0.05)
            seen.append(("other's turn", state()))
            pass_turn(turns, turn + 1)

    async def group() -> None:
        turns = {"dir": str(tmp_path / "turns"), "parties": 2, "party": 0, "settle_s": 0.0}
        results, _ = await asyncio.gather(
            _in_turn(Engine(), [[5], [6]], None, turns), other_party(tmp_path / "turns", 2)
        )
        assert [r["token_ids"] for r in results.values()] == [[1, 2], [1, 2]]

    try:
        asyncio.run(group())
        assert seen == [
            ("own turn", "running"),
            ("other's turn", "stopped"),
            ("own turn", "running"),
            ("other's turn", "stopped"),
        ]
        assert state() == "running"  # resumed once the group is done, so it can shut down
    finally:
        child.kill()
        child.wait()


def test_a_failed_engine_releases_the_rest_of_its_group(tmp_path: Path) -> None:
    (tmp_path / ABORT_FILE).touch()
    with pytest.raises(RuntimeError, match="another engine of this group failed"):
        asyncio.run(wait_for_turn(tmp_path / "turns", 3, timeout_s=30))
    with pytest.raises(RuntimeError, match="another engine of this group failed"):
        asyncio.run(wait_for_peers(tmp_path / "barrier", 2, timeout_s=30))


def test_paired_engines_start_timing_together_or_fail_clearly(tmp_path: Path) -> None:
    async def both() -> None:
        await asyncio.gather(wait_for_peers(tmp_path / "pair", 2), wait_for_peers(tmp_path / "pair", 2))

    asyncio.run(both())
    assert len(list((tmp_path / "pair").glob("ready-*"))) == 2
    with pytest.raises(TimeoutError, match="only 1 of 2 engines became ready"):
        asyncio.run(wait_for_peers(tmp_path / "alone", 2, timeout_s=0.2))
    with pytest.raises(TimeoutError, match="turn 1 never came"):
        asyncio.run(wait_for_turn(tmp_path / "turns", 1, timeout_s=0.2))


def test_streams_must_include_one() -> None:
    assert FastBenchConfig(streams=[16, 1, 4]).streams == [1, 4, 16]
    with pytest.raises(ValidationError, match="streams must include 1"):
        FastBenchConfig(streams=[4, 16])


def test_plot_bars_name_compared_heads_by_version() -> None:
    assert _bar_label("k3") == "eagle3 k=3"
    assert _bar_label("compare smollm2-135m-instruct-eagle3@r7 k2") == "compare @r7 k=2"
    assert _bar_label("oracle k5") == "oracle k5"
