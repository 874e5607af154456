"""What every stage shares: resolving the base model, the run directory, curves, and publishing the
candidate (kind="model") and the run (kind="run": trace, history, curves) with lineage."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from evalsuite.schema import Difficulty
from infra.manifest import Lineage
from infra.registry import Registry, open_registry
from posttrain.config import OutputConfig
from posttrain.trace import TRACE_NAME, read_trace

log = logging.getLogger(__name__)


class CandidateResult(BaseModel):
    """What a post-training stage returns."""

    stage: str
    model_dir: str
    run_dir: str
    candidate_ref: str | None = None
    run_ref: str | None = None
    metrics: dict[str, Any]


def resolve_base(ref_or_path: str, registry: Registry) -> Path:
    """A local directory with the base weights: a registry ref (the bundled one published on demand)
    or an existing directory."""
    path = Path(ref_or_path)
    if path.is_dir():
        return path
    from infra.bundled import BUNDLED_REF, publish_bundled_model

    if ref_or_path == BUNDLED_REF and not registry.exists(BUNDLED_REF):
        publish_bundled_model(registry)
    return registry.fetch(ref_or_path)


def run_directory(output: OutputConfig, stage: str) -> Path:
    if output.work_dir:
        path = Path(output.work_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"tandem-posttrain-{stage}-"))


def save_curves(history: list[dict[str, float]], path: Path, title: str) -> Path | None:
    """The run's curves against step, as one PNG: reward, loss, held-out pass rate, the rollouts' pass rate per
    difficulty tier (one line a tier), entropy, KL to the reference, staleness (whichever the history has)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = {f"pass_rate_{tier}": i for i, tier in enumerate(get_args(Difficulty))}
    tiers = sorted(
        {k for row in history for k in row if k.startswith("pass_rate_")}, key=lambda k: (order.get(k, 9), k)
    )
    panels: list[tuple[str, list[str]]] = [
        (key, [key]) for key in ("reward", "loss", "held_out_pass_rate") if any(key in row for row in history)
    ]
    if tiers:
        panels.append(("pass rate per tier", tiers))
    panels += [(key, [key]) for key in ("entropy", "kl", "staleness") if any(key in row for row in history)]
    if not panels:
        return None
    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3), squeeze=False)
    for axis, (name, keys) in zip(axes[0], panels, strict=True):
        for key in keys:
            points = [(row["step"], row[key]) for row in history if key in row]
            axis.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker=".",
                label=key.removeprefix("pass_rate_"),
            )
        if len(keys) > 1:
            axis.legend(fontsize="small")
        axis.set_title(name)
        axis.set_xlabel("step")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def publish_candidate(
    output: OutputConfig,
    registry: Registry,
    stage: str,
    model_dir: Path,
    run_dir: Path,
    base_ref: str,
    config: BaseModel,
    task_set: dict[str, Any],
    metrics: dict[str, Any],
) -> tuple[str, str]:
    """Publish the run (trace, history, curves) then the candidate whose lineage points at it."""
    version = output.version or time.strftime(f"{stage}-%Y%m%d-%H%M%S", time.gmtime())
    read_trace(run_dir / TRACE_NAME)  # refuse to publish a corrupted trace
    bundle = Path(tempfile.mkdtemp(prefix="tandem-run-"))
    try:
        for name in (TRACE_NAME, TRACE_NAME + ".sha256", "history.json", "curves.png", "config.json"):
            if (run_dir / name).exists():
                shutil.copy2(run_dir / name, bundle / name)
        lineage = Lineage(
            parents=[base_ref],
            produced_by=f"tandem posttrain {stage}",
            config=config.model_dump(mode="json"),
            metrics={**metrics, "task_set": task_set},
        )
        run_manifest = registry.publish(
            bundle,
            f"{output.candidate_name}-run",
            version,
            kind="run",
            lineage=lineage,
            metadata={"stage": stage},
        )
    finally:
        shutil.rmtree(bundle, ignore_errors=True)
    candidate = registry.publish(
        model_dir,
        output.candidate_name,
        version,
        kind="model",
        lineage=lineage.model_copy(update={"parents": [base_ref, run_manifest.ref]}),
        metadata={"stage": stage, "trace": f"{run_manifest.ref}/{TRACE_NAME}"},
    )
    log.info("event=candidate_published ref=%s run=%s", candidate.ref, run_manifest.ref)
    return candidate.ref, run_manifest.ref


def open_output_registry(output: OutputConfig) -> Registry:
    return open_registry(output.registry)
