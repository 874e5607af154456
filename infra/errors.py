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


class RegistryUnavailable(RegistryError):
    """The registry's storage cannot be reached (S3 endpoint down, refusing or timing out); the same command
    may succeed once it is back. The message names the registry, the step that needed it and the operation."""

    def __init__(self, location: str, operation: str, reason: str, step: str | None = None) -> None:
        self.location, self.operation, self.reason, self.step = location, operation, reason, step
        during = f" while {step}" if step else ""
        super().__init__(f"registry {location} is unreachable{during} ({operation}): {reason}")

    def __reduce__(self) -> tuple[type[RegistryUnavailable], tuple[str, str, str, str | None]]:
        # Keeps the fields through pickling (Ray ships exceptions between processes).
        return type(self), (self.location, self.operation, self.reason, self.step)

    def during(self, step: str) -> RegistryUnavailable:
        """The same outage naming the step it interrupted; an inner step already named is kept."""
        return self if self.step else RegistryUnavailable(self.location, self.operation, self.reason, step)


class RolloutError(TandemError):
    """A rollout cannot start or continue (bad gate report, corrupt state, refused transition)."""
