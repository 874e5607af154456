"""Errors raised by the eval suite; all derive from :class:`infra.errors.TandemError`."""

from __future__ import annotations

from infra.errors import TandemError


class EvalError(TandemError):
    """An evaluation could not be generated, run or scored."""


class GeneratorError(EvalError):
    """A task generator was asked for something it cannot produce (unknown family, type or tier)."""


class SandboxError(EvalError):
    """The bubblewrap sandbox could not be created, used or cleaned up."""


class GateError(EvalError):
    """The release gate could not reach a verdict (unreadable logs, bad policy): exit code 2."""
