"""The bundled model: converted once, verified on every start, re-prepared when corrupted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infra.manifest import MANIFEST_NAME
from infra.registry import FileRegistry
from serving.bundled import BUNDLED_REF, bundled_gguf_path, prepare_bundled_model, publish_bundled_model


def test_gguf_located_without_import() -> None:
    path = bundled_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000


def test_prepared_model_is_verified_and_idempotent(bundled_model_dir: Path) -> None:
    manifest = json.loads((bundled_model_dir / MANIFEST_NAME).read_text())
    assert {f["path"] for f in manifest["files"]} >= {"model.safetensors", "config.json", "tokenizer.json"}
    before = (bundled_model_dir / "model.safetensors").stat().st_mtime_ns
    assert prepare_bundled_model() == bundled_model_dir
    assert (bundled_model_dir / "model.safetensors").stat().st_mtime_ns == before  # not rebuilt


@pytest.mark.slow
def test_corrupted_copy_is_reprepared(bundled_model_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(bundled_model_dir, copy)
    with (copy / "model.safetensors").open("r+b") as handle:
        handle.seek(10_000)
        handle.write(b"\x00corrupt\x00")
    prepare_bundled_model(copy)
    assert (copy / "model.safetensors").read_bytes() == (bundled_model_dir / "model.safetensors").read_bytes()


def test_published_to_registry_once(tmp_path: Path, bundled_model_dir: Path) -> None:
    registry = FileRegistry(tmp_path / "registry")
    first = publish_bundled_model(registry)
    second = publish_bundled_model(registry)
    assert first.ref == second.ref == BUNDLED_REF
    assert first.created_at == second.created_at
    assert (registry.fetch(BUNDLED_REF) / "model.safetensors").is_file()
