"""``tandem distill``'s stage progress off a terminal: plain lines a log can show while the run goes on."""

from __future__ import annotations

import io

from rich.console import Console

from distill.cli import _stage_progress


def _plain_lines(
    updates: list[tuple[str, int, int, str]], every_s: float, terminal: bool = False
) -> list[str]:
    """The timestamped lines (timestamp dropped) that ``updates`` print on a console of that kind."""
    output = io.StringIO()
    console = Console(file=output, force_terminal=terminal, width=120)
    with _stage_progress(console, every_s=every_s) as update:
        for stage, done, total, status in updates:
            update(stage, done, total, status)
    lines = [line for line in output.getvalue().splitlines() if ": " in line and line[:2].isdigit()]
    return [line.split(" ", 1)[1] for line in lines]


def test_a_log_gets_a_line_per_stage_now_and_then_and_when_it_ends() -> None:
    updates = [
        ("greedy completions", 0, 4, "shards"),
        ("greedy completions", 1, 4, "shards"),  # within every_s of the last line: quiet
        ("greedy completions", 4, 4, "shards"),
        ("greedy completions", 4, 4, "shards"),  # finished already: said once
        ("train head", 0, 10, ""),
    ]
    assert _plain_lines(updates, every_s=3600) == [
        "greedy completions: 0/4 shards",
        "greedy completions: 4/4 shards",
        "train head: 0/10",
    ]


def test_every_update_is_a_line_when_the_interval_is_zero() -> None:
    updates = [("train head", step, 10, f"loss={3 - step}.0") for step in range(3)]
    assert _plain_lines(updates, every_s=0) == [
        "train head: 0/10 loss=3.0",
        "train head: 1/10 loss=2.0",
        "train head: 2/10 loss=1.0",
    ]


def test_a_terminal_gets_the_bars_only() -> None:
    assert _plain_lines([("train head", 1, 10, "")], every_s=0, terminal=True) == []
