from __future__ import annotations

from pathlib import Path

from distill import DistillConfig, distill_draft, latest_draft_for
from infra.registry import FileRegistry


def tiny_config(work_dir: Path, **overrides: object) -> DistillConfig:
    settings: dict[str, object] = {
        "teacher": "tiny-teacher@v1",
        "keep_layers": [0, 3],
        "steps": 12,
        "batch_size": 4,
        "max_new_tokens": 12,
        "max_prompt_tokens": 32,
        "divergence": "fkl",
        "learning_rate": 3e-3,
        "warmup_steps": 2,
        "eval_every": 6,
        "eval_prompts": 8,
        "eval_new_tokens": 12,
        "checkpoint_every": 4,
        "compute_dtype": "float32",
        "cost_ratio": 0.25,
        "work_dir": work_dir,
        "version": "t1",
    }
    settings.update(overrides)
    return DistillConfig.model_validate(settings)


def test_acceptance_rises_and_draft_is_published(tiny_teacher_registry: FileRegistry, tmp_path: Path) -> None:
    manifest = distill_draft(
        tiny_config(tmp_path / "work"), registry=tiny_teacher_registry, show_progress=False
    )
    assert manifest.kind == "draft"
    assert manifest.lineage.parents == ["tiny-teacher@v1"]
    meta = manifest.metadata
    assert meta["acceptance_after"] > meta["acceptance_before"] + 0.05
    assert 1 <= meta["num_speculative_tokens"] <= 8
    draft_dir = tiny_teacher_registry.fetch(manifest.ref)
    assert (draft_dir / "distill_curve.png").stat().st_size > 0
    assert (draft_dir / "tokenizer.json").is_file()
    found = latest_draft_for(tiny_teacher_registry, "tiny-teacher")
    assert found is not None and found.ref == manifest.ref
    assert latest_draft_for(tiny_teacher_registry, "no-such-model@v1") is None
