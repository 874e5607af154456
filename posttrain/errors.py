"""The posttrain package's exceptions, all under :class:`infra.errors.TandemError`."""

from __future__ import annotations

from infra.errors import TandemError


class PosttrainError(TandemError):
    """Post-training could not proceed."""


class UnsupportedFamily(PosttrainError):
    """A task family has no single-turn rollout format in post-training yet."""


class TraceCorrupted(PosttrainError):
    """A rollout trace does not match its digest or holds a malformed record."""


class CheckpointCorrupted(PosttrainError):
    """A checkpoint's files do not match its manifest, or it belongs to another run."""


class RewardHackingDetected(PosttrainError):
    """The canary fired: training reward rose while held-out pass rate fell."""

    exit_code = 3


class TrainingDiverged(PosttrainError):
    """Loss or gradient-norm spikes persisted after every allowed rollback."""

    exit_code = 3


class TrainingInterrupted(PosttrainError):
    """SIGTERM or SIGINT stopped training after a checkpoint was saved; the same command resumes."""

    exit_code = 130
