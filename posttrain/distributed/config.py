"""How a post-training run uses Ray: the cluster, the rollout engines, the learner ranks, the scheduler and the
staleness of asynchronous rollout. Part of a stage's run config (``RLRunConfig.ray``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from posttrain.distributed.engines import RolloutEngineConfig
from posttrain.distributed.learner import LearnerConfig
from posttrain.distributed.scheduler import SchedulerConfig


class RayConfig(BaseModel):
    """Post-training on Ray: N vLLM rollout engines, M Ray Train learner ranks, one scheduler."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None,
        description="Ray cluster to join ('auto', 'ray://head:10001', 'host:6379'); None joins RAY_ADDRESS when "
        "set, else starts a local Ray for this run (nothing to set up on a laptop).",
    )
    num_cpus: int | None = Field(
        None,
        ge=1,
        description="Logical CPUs of a local Ray (None: at least 8, so engines, learners and verifiers all get "
        "scheduled on a small machine; they still share its real cores).",
    )
    engines: int = Field(1, ge=1, description="vLLM rollout engines (Ray actors).")
    engine: RolloutEngineConfig = Field(
        default_factory=RolloutEngineConfig,
        description="Each engine's vLLM settings: the serving tiers' EngineConfig, sized for rollouts.",
    )
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    max_staleness: int = Field(
        1,
        ge=0,
        description="Policy versions a step's rollouts may lag the learner: 0 = synchronous (sample with the "
        "newest weights, then train), 1 = sampling for step n+1 overlaps training on step n.",
    )
    step_timeout_s: float = Field(
        1800.0, gt=0, description="Most time the driver waits for one learner step before giving up."
    )
