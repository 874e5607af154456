from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from distill import DistillConfig, distill_draft, latest_draft_for
from infra.registry import FileRegistry


def tiny_config(work_dir: Path, **overrides: object) -> DistillConfig:
    settings: dict[str, object] = {
        "teacher": "tiny-teacher@v1",
        "keep_layers": [0, 3],
        "steps": 8,
        "batch_size": 4,
        "max_new_tokens": 12,
        "max_prompt_tokens": 32,
        "divergence": "fkl",
        "learning_rate": 1e-2,
        "warmup_steps": 2,
        "eval_every": 4,
        "eval_prompts": 8,
        "eval_new_tokens": 12,
        "checkpoint_every": 4,
        "compute_dtype": "float32",
        "cost_ratio": 0.25,
        "threads": 1,
        "work_dir": work_dir,
        "version": "t1",
    }
    settings.update(overrides)
    return DistillConfig.model_validate(settings)


def test_layer_subset_draft_is_trained_and_published(
    tiny_teacher_registry: FileRegistry, tmp_path: Path
) -> None:
    manifest = distill_draft(tiny_config(tmp_path / "work"), registry=tiny_teacher_registry)
    assert manifest.kind == "draft"
    assert manifest.lineage.parents == ["tiny-teacher@v1"]
    meta = manifest.metadata
    assert meta["keep_layers"] == [0, 3]
    assert 1 <= meta["num_speculative_tokens"] <= 8
    assert meta["speculative_config"] == {
        "method": "draft_model",
        "num_speculative_tokens": meta["num_speculative_tokens"],
    }
    draft_dir = tiny_teacher_registry.fetch(manifest.ref)
    assert json.loads((draft_dir / "config.json").read_text())["num_hidden_layers"] == 2
    assert (draft_dir / "distill_curve.png").stat().st_size > 0
    assert (draft_dir / "tokenizer.json").is_file()
    report = json.loads((draft_dir / "distill_report.json").read_text())
    losses = [loss for _, loss in report["history"]["main fkl"]["losses"]]
    assert sum(losses[-3:]) < sum(losses[:3])
    found = latest_draft_for(tiny_teacher_registry, "tiny-teacher")
    assert found is not None and found.ref == manifest.ref
    assert latest_draft_for(tiny_teacher_registry, "no-such-model@v1") is None


def test_full_depth_draft_with_all_layers_matches_teacher(
    tiny_teacher_registry: FileRegistry, tmp_path: Path
) -> None:
    manifest = distill_draft(
        tiny_config(tmp_path / "work", keep_layers=[0, 1, 2, 3], steps=0, publish=False),
        registry=tiny_teacher_registry,
    )
    assert manifest.metadata["acceptance_before"] == pytest.approx(1.0, abs=1e-4)


def test_distillation_raises_acceptance(tiny_teacher_registry: FileRegistry, tmp_path: Path) -> None:
    """A draft that can represent the teacher (all layers, weights perturbed) is pulled back towards it."""
    from transformers import AutoModelForCausalLM

    teacher_dir = tiny_teacher_registry.fetch("tiny-teacher@v1")
    perturbed = tmp_path / "perturbed"
    model = AutoModelForCausalLM.from_pretrained(teacher_dir)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if ".layers." in name and weight.dim() == 2:
                weight.add_(torch.randn(weight.shape, generator=generator) * 0.1)
    model.save_pretrained(perturbed)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (teacher_dir / name).is_file():
            shutil.copy2(teacher_dir / name, perturbed / name)
    manifest = distill_draft(
        tiny_config(tmp_path / "work", init_from=str(perturbed), steps=12, learning_rate=2e-2, publish=False),
        registry=tiny_teacher_registry,
    )
    assert manifest.metadata["acceptance_after"] > manifest.metadata["acceptance_before"] + 0.03
