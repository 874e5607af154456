from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_distill_draft import tiny_config

from distill import CheckpointError, distill_draft
from distill.training import DraftDistiller
from infra.registry import FileRegistry


class Interrupted(Exception):
    pass


def _losses(work_dir: Path) -> list[tuple[int, float]]:
    state = torch.load(work_dir / "main" / "checkpoint.pt", weights_only=False)
    return [(int(s), float(v)) for s, v in state["history"]["losses"]]


def test_interrupted_run_resumes_from_checkpoint(
    tiny_teacher_registry: FileRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {"steps": 6, "checkpoint_every": 2, "eval_every": 6, "eval_prompts": 4, "publish": False}
    straight = tiny_config(tmp_path / "straight", **settings)
    distill_draft(straight, registry=tiny_teacher_registry)

    original = DraftDistiller.train_step

    def failing_step(self: DraftDistiller, divergence: str) -> float:  # type: ignore[no-untyped-def]
        if self.step == 3:
            raise Interrupted
        return original(self, divergence)  # type: ignore[arg-type]

    interrupted = tiny_config(tmp_path / "interrupted", **settings)
    monkeypatch.setattr(DraftDistiller, "train_step", failing_step)
    with pytest.raises(Interrupted):
        distill_draft(interrupted, registry=tiny_teacher_registry)
    assert [s for s, _ in _losses(tmp_path / "interrupted")] == [1, 2]
    monkeypatch.setattr(DraftDistiller, "train_step", original)
    distill_draft(interrupted, registry=tiny_teacher_registry)

    resumed, reference = _losses(tmp_path / "interrupted"), _losses(tmp_path / "straight")
    assert [s for s, _ in resumed] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v in resumed] == pytest.approx([v for _, v in reference], rel=1e-4)


def test_checkpoint_from_other_config_is_refused(tiny_teacher_registry: FileRegistry, tmp_path: Path) -> None:
    work_dir = tmp_path / "work"
    distill_draft(
        tiny_config(work_dir, steps=2, checkpoint_every=2, eval_prompts=4, publish=False),
        registry=tiny_teacher_registry,
    )
    with pytest.raises(CheckpointError, match="learning_rate"):
        distill_draft(
            tiny_config(work_dir, steps=4, learning_rate=1e-4, eval_prompts=4, publish=False),
            registry=tiny_teacher_registry,
        )
