"""Artifact manifests: what a registry version contains and where it came from."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

ArtifactKind = Literal["model", "draft", "eval-logs", "run", "report", "preferences", "evalset", "other"]
MANIFEST_NAME = "tandem-manifest.json"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class FileEntry(BaseModel):
    path: str = Field(description="Path relative to the artifact root, with forward slashes.")
    sha256: str
    size: int


class Lineage(BaseModel):
    """Where an artifact came from: its parents in the registry and how it was made."""

    parents: list[str] = Field(
        default_factory=list, description="Registry refs ('name@version') it derives from."
    )
    produced_by: str = Field(default="", description="The command or stage that produced it.")
    config: dict[str, Any] = Field(default_factory=dict, description="The producing stage's configuration.")
    metrics: dict[str, Any] = Field(
        default_factory=dict, description="Measurements taken when it was produced."
    )


class ArtifactManifest(BaseModel):
    """The manifest stored beside every artifact version; the registry verifies files against it."""

    name: str
    version: str
    kind: ArtifactKind = "other"
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    files: list[FileEntry]
    lineage: Lineage = Field(default_factory=Lineage)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def total_size(self) -> int:
        return sum(entry.size for entry in self.files)


def scan_directory(root: Path) -> list[FileEntry]:
    """Hash every regular file under ``root`` (the manifest itself excluded), sorted by path."""
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative == MANIFEST_NAME:
            continue
        entries.append(FileEntry(path=relative, sha256=sha256_file(path), size=path.stat().st_size))
    return entries
