"""Publishing a trained draft (any method) to the registry, with lineage back to its teacher."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.manifest import ArtifactManifest, Lineage, scan_directory
from infra.registry import Registry


def publish_draft(
    registry: Registry,
    draft_dir: Path,
    *,
    teacher: ArtifactManifest,
    config: BaseModel,
    name: str | None,
    version: str | None,
    suffix: str,
    produced_by: str,
    metadata: dict[str, Any],
    publish: bool,
    parents: tuple[str, ...] = (),
) -> ArtifactManifest:
    """Publish ``draft_dir`` as ``<name or teacher name + suffix>@<version or a UTC stamp>`` (kind=draft);
    with ``publish`` off, return the manifest it would have without writing to the registry. ``parents``
    are further lineage parents after the teacher (a draft it continued from)."""
    name = name or f"{teacher.name}{suffix}"
    version = version or datetime.now(UTC).strftime("v%Y%m%d-%H%M%S")
    lineage = Lineage(
        parents=[teacher.ref, *parents],
        produced_by=produced_by,
        config=config.model_dump(mode="json"),
        metrics={key: value for key, value in metadata.items() if isinstance(value, int | float)},
    )
    if not publish:
        return ArtifactManifest(
            name=name,
            version=version,
            kind="draft",
            files=scan_directory(draft_dir),
            lineage=lineage,
            metadata=metadata,
        )
    return registry.publish(draft_dir, name, version, kind="draft", lineage=lineage, metadata=metadata)
