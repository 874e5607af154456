"""Loss and acceptance curves, saved as a PNG beside the draft."""

from __future__ import annotations

from pathlib import Path

from distill.training import TrainingHistory


def plot_training_curves(
    histories: dict[str, TrainingHistory], path: Path, *, chosen: str | None = None
) -> Path:
    """One panel of loss per step and one of held-out acceptance, a line per run (sweep candidates, main)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axis, acceptance_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for label, history in histories.items():
        width = 2.0 if label == chosen else 1.0
        if history.losses:
            steps, values = zip(*history.losses, strict=True)
            loss_axis.plot(steps, values, label=label, linewidth=width)
        if history.evaluations:
            steps, expected, greedy = zip(*history.evaluations, strict=True)
            acceptance_axis.plot(steps, expected, marker="o", label=f"{label} E[min(p,q)]", linewidth=width)
            acceptance_axis.plot(steps, greedy, linestyle="--", label=f"{label} greedy", linewidth=width)
    loss_axis.set(title="distillation loss (per token)", xlabel="step", yscale="log")
    acceptance_axis.set(title="held-out acceptance", xlabel="step", ylim=(0, 1))
    loss_axis.legend(fontsize=7)
    acceptance_axis.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
