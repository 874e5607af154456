"""The head's training picture: loss per step and held-out chain acceptance per draft position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CURVE_NAME = "eagle3_curve.png"


def plot_head_training(
    history: list[dict[str, float]], evaluations: list[dict[str, Any]], path: Path
) -> Path:
    """Two panels: training loss per optimizer step, and P(draft tokens 1..j accepted) on held-out prompts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axis, acceptance_axis) = plt.subplots(1, 2, figsize=(11, 4))
    if history:
        loss_axis.plot([h["step"] for h in history], [h["loss"] for h in history], linewidth=0.8)
    loss_axis.set(title="training loss (step-weighted CE)", xlabel="optimizer step", yscale="log")
    steps = [e["step"] for e in evaluations]
    depth = len(evaluations[0]["per_position"]) if evaluations else 0
    for j in range(depth):
        acceptance_axis.plot(
            steps, [e["per_position"][j] for e in evaluations], marker="o", label=f"tokens 1..{j + 1}"
        )
    acceptance_axis.plot(
        steps, [e["mean_accepted"] / max(1, depth) for e in evaluations], "k--", label="acceptance rate"
    )
    acceptance_axis.set(title="held-out greedy acceptance (chains)", xlabel="optimizer step", ylim=(0, 1))
    acceptance_axis.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
