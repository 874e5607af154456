"""The built-in algorithms' run configs, each registered with its trainer (:func:`posttrain_algorithm`).

Kept apart from :mod:`posttrain.config` so the registry can name ``RunConfig`` without an import cycle.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from posttrain.algorithms import posttrain_algorithm
from posttrain.config import RewardConfig, RunConfig
from posttrain.distributed.config import RayConfig


@posttrain_algorithm("sft", trainer="posttrain.sft:posttrain_sft")
class SFTRunConfig(RunConfig):
    """Supervised fine-tuning on generator-made demonstrations of the train split."""


@posttrain_algorithm("rl", trainer="posttrain.rl:posttrain_rl")
class RLRunConfig(RunConfig):
    """GRPO with verifier rewards: on Ray (vLLM rollout engines, a scheduler, a Ray Train learner), or in one
    process with TRL's GRPOTrainer when ``ray`` is null."""

    reward: RewardConfig = Field(default_factory=RewardConfig)
    num_generations: int = Field(default=4, ge=2, description="Completions per prompt (one GRPO group).")
    max_completion_length: int = Field(default=48, ge=1, description="Token budget of one completion.")
    temperature: float = Field(default=1.0, gt=0.0, description="Sampling temperature of rollouts.")
    top_k: int | None = Field(
        default=None, ge=1, description="Sample among the k likeliest tokens; None = all."
    )
    beta: float = Field(default=0.0, ge=0.0, description="KL coefficient against the reference policy.")
    ray: RayConfig | None = Field(
        default_factory=RayConfig,
        description="Run on Ray: vLLM rollout engines, the scheduler, a Ray Train learner, asynchronous "
        "rollout. null runs TRL's GRPOTrainer in this process (rollouts from HF generate).",
    )


# A ``pairs`` source: the verifiers, or a review session's published preferences (``reviews:<session>[@version]``).
_PAIR_SOURCE = re.compile(r"^(verifier|reviews:[a-z0-9][a-z0-9._-]{0,95}(@[a-z0-9][a-z0-9._-]{0,127})?)$")


@posttrain_algorithm("dpo", trainer="posttrain.dpo:posttrain_dpo")
class DPORunConfig(RunConfig):
    """DPO on preference pairs: verifier-labelled rollouts (correct over wrong) and/or human blind reviews."""

    pairs: list[str] = Field(
        default_factory=lambda: ["verifier"],
        min_length=1,
        description="Preference sources: 'verifier' (sampled rollouts the verifiers label) and/or "
        "'reviews:<session>[@version]' (blind-review preferences from `tandem review export --pairs`).",
    )

    samples_per_prompt: int = Field(
        default=4, ge=2, description="Rollouts sampled per prompt to find a pair."
    )
    max_completion_length: int = Field(default=48, ge=1, description="Token budget of one sampled rollout.")
    temperature: float = Field(default=1.0, gt=0.0, description="Sampling temperature of rollouts.")
    beta: float = Field(default=0.1, gt=0.0, description="DPO temperature.")
    use_reference_demos: bool = Field(
        default=True,
        description="When no sampled rollout is correct, use the generator's demonstration as chosen.",
    )

    @field_validator("pairs")
    @classmethod
    def _known_sources(cls, pairs: list[str]) -> list[str]:
        bad = [p for p in pairs if not _PAIR_SOURCE.match(p)]
        if bad:
            raise ValueError(f"unknown pair sources {bad} (allowed: verifier, reviews:<session>[@version])")
        return list(dict.fromkeys(pairs))
