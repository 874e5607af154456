"""The distill package's exceptions, all under :class:`infra.errors.TandemError`."""

from __future__ import annotations

from infra.errors import TandemError


class DistillError(TandemError):
    """Draft distillation could not proceed."""


class TokenizerMismatch(DistillError):
    """Teacher and draft do not share a tokenizer/vocabulary, so the draft's proposals are meaningless."""


class CheckpointError(DistillError):
    """A training checkpoint exists but cannot be resumed (different config or unreadable)."""
