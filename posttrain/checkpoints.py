"""Verified checkpoints: each trainer checkpoint gets a sidecar with the run's own state (curriculum,
guards, trace position) and a sha256 manifest; resuming refuses a checkpoint that fails either."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra.config import config_digest as digest_of
from infra.errors import IntegrityError
from infra.manifest import ArtifactManifest, scan_directory
from infra.registry import verify_directory
from posttrain.errors import CheckpointCorrupted

log = logging.getLogger(__name__)
STATE_NAME = "posttrain-state.json"
MANIFEST_NAME = "posttrain-checkpoint.json"
_STEP = re.compile(r"^checkpoint-(\d+)$")


class RunState(BaseModel):
    """What a checkpoint adds to the trainer's own state."""

    config_digest: str
    step: int
    pool: dict[str, Any] = Field(default_factory=dict)
    guards: dict[str, Any] = Field(default_factory=dict)
    trace_records: int = 0
    history: list[dict[str, float]] = Field(default_factory=list)
    train_seconds: float = Field(0.0, description="Training time the run had spent when this was saved.")


def config_digest(config: BaseModel) -> str:
    """Digest of the settings that must match to resume.

    Output settings, the time budget and the device are excluded: a resumed run may write elsewhere, get
    more time or move to other hardware.
    """
    exclude: dict[str, Any] = {"output": True, "train": {"time_budget_s", "device"}}
    # Settings added after runs were already checkpointed count only when changed from their defaults, so
    # those runs still resume: the episode settings, and the pool's per-family rollout protocol.
    episodes = getattr(config, "episodes", None)
    if episodes is not None and episodes == type(episodes)():
        exclude["episodes"] = True
    pool = getattr(config, "pool", None)
    if pool is not None and not getattr(pool, "rollout", None):
        exclude["pool"] = {"rollout"}
    return digest_of(config, exclude=exclude)


def seal_checkpoint(directory: Path, state: RunState) -> None:
    (directory / STATE_NAME).write_text(state.model_dump_json())
    manifest = ArtifactManifest(name="checkpoint", version=directory.name, files=scan_directory(directory))
    manifest.files = [f for f in manifest.files if f.path != MANIFEST_NAME]
    (directory / MANIFEST_NAME).write_text(manifest.model_dump_json())


def load_checkpoint(directory: Path, expected_digest: str) -> RunState:
    """The run state of a checkpoint after verifying every file; raises :class:`CheckpointCorrupted`."""
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        raise CheckpointCorrupted(f"checkpoint {directory}: no {MANIFEST_NAME} (incomplete or not ours)")
    try:
        manifest = ArtifactManifest.model_validate_json(manifest_path.read_text())
        verify_directory(directory, manifest)
        state = RunState.model_validate_json((directory / STATE_NAME).read_text())
    except (IntegrityError, ValueError, OSError) as exc:
        raise CheckpointCorrupted(f"checkpoint {directory}: {exc}") from exc
    if state.config_digest != expected_digest:
        raise CheckpointCorrupted(
            f"checkpoint {directory} belongs to a run with another configuration (digest "
            f"{state.config_digest[:12]} != {expected_digest[:12]})"
        )
    return state


def checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories of a run, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).glob("checkpoint-*") if (m := _STEP.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path, expected_digest: str, before_step: int | None = None) -> Path | None:
    """Newest sealed checkpoint (strictly before ``before_step`` when given).

    An unsealed one (a crash between the trainer's save and our seal) is skipped with a warning; a sealed
    one that fails verification raises :class:`CheckpointCorrupted` rather than being resumed or skipped.
    """
    candidates = [
        p for p in checkpoints(run_dir) if before_step is None or int(p.name.split("-")[1]) < before_step
    ]
    for candidate in reversed(candidates):
        if not (candidate / MANIFEST_NAME).is_file():
            log.warning("event=checkpoint_unsealed path=%s action=skip", candidate)
            continue
        load_checkpoint(candidate, expected_digest)
        return candidate
    return None


def discard_after(run_dir: Path, step: int) -> None:
    """Delete checkpoints newer than ``step`` (they hold the state a rollback abandons)."""
    for path in checkpoints(run_dir):
        if int(path.name.split("-")[1]) > step:
            shutil.rmtree(path)
