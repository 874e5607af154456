"""Post-training: SFT on generator demonstrations, GRPO with verifier rewards, DPO on verifier-labelled
pairs; a curriculum task pool, rollout traces, verified checkpoints and guards; candidates published to
the registry with lineage. Trainers import torch/trl lazily, so this package imports fast."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posttrain.config import (
    DPORunConfig,
    EvalConfig,
    GuardConfig,
    OutputConfig,
    RewardConfig,
    RLRunConfig,
    SFTRunConfig,
    TaskPoolConfig,
    TrainConfig,
)
from posttrain.errors import (
    CheckpointCorrupted,
    PosttrainError,
    RewardHackingDetected,
    TraceCorrupted,
    TrainingDiverged,
    TrainingInterrupted,
    UnsupportedFamily,
)
from posttrain.formats import RolloutFormat, format_for, rollout_format
from posttrain.pool import TaskPool
from posttrain.rewards import VerifierReward, combine_reward
from posttrain.run import CandidateResult
from posttrain.trace import RolloutRecord, TraceWriter, read_trace

if TYPE_CHECKING:
    from posttrain.dpo import posttrain_dpo
    from posttrain.rl import posttrain_rl
    from posttrain.sft import posttrain_sft

_LAZY = {"posttrain_sft": "posttrain.sft", "posttrain_rl": "posttrain.rl", "posttrain_dpo": "posttrain.dpo"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = [
    "CandidateResult",
    "CheckpointCorrupted",
    "DPORunConfig",
    "EvalConfig",
    "GuardConfig",
    "OutputConfig",
    "PosttrainError",
    "RLRunConfig",
    "RewardConfig",
    "RewardHackingDetected",
    "RolloutFormat",
    "RolloutRecord",
    "SFTRunConfig",
    "TaskPool",
    "TaskPoolConfig",
    "TraceCorrupted",
    "TraceWriter",
    "TrainConfig",
    "TrainingDiverged",
    "TrainingInterrupted",
    "UnsupportedFamily",
    "VerifierReward",
    "combine_reward",
    "format_for",
    "posttrain_dpo",
    "posttrain_rl",
    "posttrain_sft",
    "read_trace",
    "rollout_format",
]
