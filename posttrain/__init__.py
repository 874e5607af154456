"""Post-training: SFT on generator demonstrations, GRPO with verifier rewards, DPO on verifier-labelled
pairs, on single-turn rollouts or multi-turn tool episodes (:mod:`posttrain.episodes`); a curriculum task
pool, rollout traces, verified checkpoints and guards; candidates published to the registry with lineage.
Each algorithm is a run config paired with its trainer in :mod:`posttrain.algorithms`;
``posttrain.posttrain_<name>`` is that trainer, imported on first use (torch and trl load then), so this
package imports fast."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posttrain.algorithms import PosttrainAlgorithm, algorithm_names, get_algorithm, posttrain_algorithm
from posttrain.config import (
    EpisodeConfig,
    EvalConfig,
    GuardConfig,
    OutputConfig,
    RewardConfig,
    RunConfig,
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
from posttrain.stages import DPORunConfig, RLRunConfig, SFTRunConfig
from posttrain.trace import RolloutRecord, TraceWriter, read_trace

if TYPE_CHECKING:
    from posttrain.dpo import posttrain_dpo
    from posttrain.rl import posttrain_rl
    from posttrain.sft import posttrain_sft

_TRAINER_PREFIX = "posttrain_"


def __getattr__(name: str) -> Any:
    """``posttrain_<algorithm>``: the registered algorithm's trainer, imported on first use."""
    algorithm = name.removeprefix(_TRAINER_PREFIX)
    if name.startswith(_TRAINER_PREFIX) and algorithm in algorithm_names():
        return get_algorithm(algorithm).load_trainer()
    raise AttributeError(name)


__all__ = [
    "CandidateResult",
    "CheckpointCorrupted",
    "DPORunConfig",
    "EpisodeConfig",
    "EvalConfig",
    "GuardConfig",
    "OutputConfig",
    "PosttrainAlgorithm",
    "PosttrainError",
    "RLRunConfig",
    "RewardConfig",
    "RewardHackingDetected",
    "RolloutFormat",
    "RolloutRecord",
    "RunConfig",
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
    "algorithm_names",
    "combine_reward",
    "format_for",
    "get_algorithm",
    "posttrain_algorithm",
    "posttrain_dpo",
    "posttrain_rl",
    "posttrain_sft",
    "read_trace",
    "rollout_format",
]
