"""Root of Tandem's exception hierarchy.

Every package raises a subclass of :class:`TandemError`. The CLI maps them once to exit codes and the
gateway maps them once to OpenAI-style HTTP errors, so no other layer needs to catch and translate.
"""

from __future__ import annotations


class TandemError(Exception):
    """Base class for every error Tandem raises on purpose."""

    exit_code: int = 2


class ConfigError(TandemError):
    """A configuration file or value is invalid; the message names the file and field."""


class RegistryError(TandemError):
    """The artifact registry refused an operation."""


class ArtifactNotFound(RegistryError):
    """No artifact with that name/version exists."""


class ArtifactExists(RegistryError):
    """Versions are immutable: publishing over an existing version is refused."""


class IntegrityError(RegistryError):
    """An artifact's bytes do not match its manifest (corrupted or tampered)."""


class RolloutError(TandemError):
    """A rollout cannot start or continue (bad gate report, corrupt state, refused transition)."""
