"""Shared foundations: the artifact registry, errors, configuration loading and telemetry."""

from infra.errors import (
    ArtifactExists,
    ArtifactNotFound,
    ConfigError,
    IntegrityError,
    RegistryError,
    TandemError,
)
from infra.manifest import ArtifactManifest, FileEntry, Lineage
from infra.registry import FileRegistry, Registry, S3Registry, open_registry, parse_ref

__all__ = [
    "ArtifactExists",
    "ArtifactManifest",
    "ArtifactNotFound",
    "ConfigError",
    "FileEntry",
    "FileRegistry",
    "IntegrityError",
    "Lineage",
    "Registry",
    "RegistryError",
    "S3Registry",
    "TandemError",
    "open_registry",
    "parse_ref",
]
