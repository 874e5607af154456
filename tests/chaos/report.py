"""Render the chaos report (``make chaos`` writes it to bench/results/chaos-latest.json) as a Markdown table.

Usage: ``python -m tests.chaos.report [path]``; README's fault table is this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "chaos-latest.json"


def render(report: dict) -> str:  # type: ignore[type-arg]
    lines = [
        f"Chaos report of {report['generated']} (`make chaos`).",
        "",
        "| scenario | injected fault | requests | clean errors | failures | recovery (s) | result | detail |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for entry in report["scenarios"]:
        test = entry["scenario"].split("::")[-1]
        recovery = "" if entry["recovery_s"] is None else f"{entry['recovery_s']:g}"
        result = {True: "pass", False: "FAIL", None: "?"}[entry["passed"]]
        detail = entry["detail"].replace("|", "\\|")  # a pipe would end the Markdown cell
        lines.append(
            f"| `{test}` | {entry['fault']} | {entry['requests']} | {entry['clean_errors']} | "
            f"{entry['failures']} | {recovery} | {result} | {detail} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    print(render(json.loads(path.read_text())))
