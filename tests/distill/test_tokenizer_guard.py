from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from distill import DistillConfig, TokenizerMismatch, distill_draft
from infra.registry import FileRegistry


def _config(work_dir: Path, init_from: Path) -> DistillConfig:
    return DistillConfig(
        teacher="tiny-teacher@v1", init_from=str(init_from), steps=2, work_dir=work_dir, publish=False
    )


def test_draft_with_other_tokenizer_is_refused_before_training(
    tiny_teacher_registry: FileRegistry, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    teacher_dir = tiny_teacher_registry.fetch("tiny-teacher@v1")
    draft_dir = tmp_path / "foreign-draft"
    shutil.copytree(teacher_dir, draft_dir, ignore=shutil.ignore_patterns("tandem-manifest.json"))
    tokenizer = AutoTokenizer.from_pretrained(draft_dir)
    tokenizer.add_tokens(["<foreign_token_a>", "<foreign_token_b>"])
    tokenizer.save_pretrained(draft_dir)
    work_dir = tmp_path / "work"
    with pytest.raises(TokenizerMismatch, match="different tokenizers"):
        distill_draft(_config(work_dir, draft_dir), registry=tiny_teacher_registry)
    assert not list(work_dir.rglob("checkpoint.pt"))


def test_draft_with_other_vocab_size_is_refused(tiny_teacher_registry: FileRegistry, tmp_path: Path) -> None:
    teacher_dir = tiny_teacher_registry.fetch("tiny-teacher@v1")
    draft_dir = tmp_path / "small-vocab-draft"
    shutil.copytree(teacher_dir, draft_dir, ignore=shutil.ignore_patterns("tandem-manifest.json"))
    config = json.loads((draft_dir / "config.json").read_text())
    config["vocab_size"] = 32000
    (draft_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerMismatch, match="vocab_size 32000"):
        distill_draft(_config(tmp_path / "work", draft_dir), registry=tiny_teacher_registry)
