"""Summarise an eval-gate.sh output folder as eval.json: per family, base and candidate counts.

Usage: python bench/posttrain/summarize_eval.py OUT_DIR BASE_REF CANDIDATE_REF > eval.json
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from evalsuite.runner import read_outcomes


def side(log_dir: Path) -> dict[str, dict[str, Any]]:
    families: dict[str, list[tuple[float | None, bool | None]]] = {}
    for outcome in read_outcomes(log_dir):
        families.setdefault(outcome.family, []).append((outcome.score, outcome.correct))
    summary: dict[str, dict[str, Any]] = {}
    for family, rows in sorted(families.items()):
        scored = [score for score, _ in rows if score is not None and not math.isnan(score)]
        correct = sum(1 for _, ok in rows if ok)
        summary[family] = {
            "n": len(rows),
            "scored": len(scored),
            "correct": correct,
            "correct_rate": round(correct / len(rows), 4),
            "mean_score": round(sum(scored) / len(scored), 4) if scored else float("nan"),
        }
    return summary


def details(log_dir: Path) -> dict[str, dict[str, Any]]:
    """Per family: correct samples per difficulty tier, and how many samples made at least one tool call (the
    count issue 16b asks for beside correct agent episodes)."""
    from inspect_ai.log import read_eval_log

    found: dict[str, dict[str, Any]] = {}
    for path in sorted(log_dir.glob("*.eval")):
        log = read_eval_log(str(path))
        for sample in log.samples or []:
            family = str(sample.metadata.get("family", log.eval.task))
            entry = found.setdefault(family, {"correct_by_difficulty": {}, "samples_with_tool_calls": 0})
            score = next(iter((sample.scores or {}).values()), None)
            correct = bool(score and (score.metadata or {}).get("correct"))
            tier = entry["correct_by_difficulty"].setdefault(str(sample.metadata.get("difficulty")), [0, 0])
            tier[0] += correct
            tier[1] += 1
            entry["samples_with_tool_calls"] += any(
                getattr(m, "tool_calls", None) for m in sample.messages if m.role == "assistant"
            )
    return found


def main(out: Path, base: str, candidate: str) -> None:
    timing = (out / "timing.txt").read_text() if (out / "timing.txt").exists() else ""
    seconds = {label: int(s) for label, s in re.findall(r"eval (\w+) \(.*\): (\d+) s", timing)}
    sides = {"base": side(out / "logs-base"), "candidate": side(out / "logs-candidate")}
    for label in sides:
        for family, extra in details(out / f"logs-{label}").items():
            sides[label].get(family, {}).update(extra)  # type: ignore[arg-type]
    families = sorted(set(sides["base"]) | set(sides["candidate"]))
    print(json.dumps({
        "base": base,
        "candidate": candidate,
        "eval_seconds": seconds,
        "families": {f: {label: sides[label].get(f) for label in sides} for f in families},
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
