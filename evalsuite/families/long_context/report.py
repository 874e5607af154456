"""The long-context report: recall by target length x needle depth, as a heatmap PNG beside the eval logs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

HEATMAP_FILE = "long_context-heatmap.png"


class NeedleOutcome(NamedTuple):
    """One scored sample: its target length in tokens, the needle's depth and whether it was recalled."""

    length: int
    depth: float
    correct: bool


def recall_grid(results: Iterable[NeedleOutcome | tuple[int, float, bool]]) -> dict[tuple[int, float], float]:
    """Recall (fraction correct) per (length, depth) cell; cells without samples are absent."""
    hits: dict[tuple[int, float], list[bool]] = {}
    for length, depth, correct in results:
        hits.setdefault((int(length), float(depth)), []).append(bool(correct))
    return {cell: sum(flags) / len(flags) for cell, flags in sorted(hits.items())}


def recall_heatmap(
    results: Sequence[NeedleOutcome | tuple[int, float, bool]], out_path: str | Path, title: str
) -> Path:
    """Write a heatmap PNG of recall with lengths as rows and depths as columns; returns its path.

    Each cell shows its recall and sample count; cells no sample reached are left blank.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = recall_grid(results)
    counts: dict[tuple[int, float], int] = {}
    for length, depth, _ in results:
        counts[(int(length), float(depth))] = counts.get((int(length), float(depth)), 0) + 1
    lengths = sorted({length for length, _ in grid})
    depths = sorted({depth for _, depth in grid})
    values = np.full((len(lengths), len(depths)), np.nan)
    for (length, depth), recall in grid.items():
        values[lengths.index(length), depths.index(depth)] = recall
    figure, axes = plt.subplots(figsize=(1.6 + 1.1 * max(1, len(depths)), 1.4 + 0.6 * max(1, len(lengths))))
    image = axes.imshow(values, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto", origin="lower")
    for (length, depth), recall in grid.items():
        row, column = lengths.index(length), depths.index(depth)
        axes.text(column, row, f"{recall:.2f}\nn={counts[(length, depth)]}", ha="center", va="center",
                  fontsize="small")  # fmt: skip
    axes.set_xticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    axes.set_yticks(range(len(lengths)), [str(length) for length in lengths])
    axes.set_xlabel("needle depth")
    axes.set_ylabel("target length (tokens)")
    axes.set_title(title)
    figure.colorbar(image, ax=axes, label="recall")
    figure.tight_layout()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def outcomes_of(samples: Iterable[Any]) -> list[NeedleOutcome]:
    """Outcomes of scored Inspect samples of this family (read from each sample's instance metadata)."""
    outcomes = []
    for sample in samples:
        instance = (sample.metadata or {}).get("instance", {})
        meta = instance.get("metadata", {})
        if instance.get("family") != "long_context" or not sample.scores or "length" not in meta:
            continue
        score = next(iter(sample.scores.values()))
        outcomes.append(
            NeedleOutcome(meta["length"], meta["depth"], bool((score.metadata or {}).get("correct")))
        )
    return outcomes


def write_report(samples: Sequence[Any], out_dir: str | Path, model: str = "") -> list[Path]:
    """The family's report hook: the recall heatmap of ``samples`` as ``long_context-heatmap.png``."""
    outcomes = outcomes_of(samples)
    if not outcomes:
        return []
    title = f"long_context recall{f': {model}' if model else ''} ({len(outcomes)} samples)"
    return [recall_heatmap(outcomes, Path(out_dir) / HEATMAP_FILE, title)]
