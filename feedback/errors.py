"""Errors of the traffic-to-eval-set tools; all derive from :class:`infra.errors.TandemError`."""

from __future__ import annotations

from infra.errors import TandemError


class EvalSetError(TandemError):
    """A traffic eval set could not be built or read."""


class NoRecordsInWindow(EvalSetError):
    """The capture window holds no (usable) records."""


class BadPeriod(EvalSetError):
    """A period label that is not a valid registry version, is already published, or names no window."""


class UnknownSet(EvalSetError):
    """No traffic eval set of that name in the registry."""
