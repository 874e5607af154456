"""``tandem distill``'s stage progress off a terminal: plain lines a log can show while the run goes on."""

from __future__ import annotations

import io

from rich.console import Console

from distill.cli import _stage_progress


def _lines(output: io.StringIO) -> list[str]:
    return [line for line in output.getvalue().splitlines() if ": " in line and line[:2].isdigit()]


def test_a_log_gets_a_line_per_stage_now_and_then_and_when_it_ends() -> None:
    output = io.StringIO()
    with _stage_progress(Console(file=output, force_terminal=False, width=120), every_s=3600) as update:
        update("greedy completions", 0, 4, "shards")
        update("greedy completions", 1, 4, "shards")  # within every_s of the last line: quiet
        update("greedy completions", 4, 4, "shards")
        update("greedy completions", 4, 4, "shards")  # finished already: said once
        update("train head", 0, 10, "")
    lines = _lines(output)
    assert [line.split(" ", 1)[1] for line in lines] == [
        "greedy completions: 0/4 shards",
        "greedy completions: 4/4 shards",
        "train head: 0/10",
    ]


def test_every_update_is_a_line_when_the_interval_is_zero() -> None:
    output = io.StringIO()
    with _stage_progress(Console(file=output, force_terminal=False, width=120), every_s=0) as update:
        for step in range(3):
            update("train head", step, 10, f"loss={3 - step}.0")
    assert [line.split(" ", 1)[1] for line in _lines(output)] == [
        "train head: 0/10 loss=3.0",
        "train head: 1/10 loss=2.0",
        "train head: 2/10 loss=1.0",
    ]


def test_a_terminal_gets_the_bars_only() -> None:
    output = io.StringIO()
    with _stage_progress(Console(file=output, force_terminal=True, width=120), every_s=0) as update:
        update("train head", 1, 10, "")
    assert not _lines(output)
