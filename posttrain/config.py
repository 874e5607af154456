"""Every tunable of the post-training loops, one typed config per stage (TRL style: documented fields).

The built-in algorithms' run configs, built from these, live in :mod:`posttrain.stages`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from evalsuite.schema import Difficulty, Family


class TaskPoolConfig(BaseModel):
    """Which generated train-split tasks the policy practises on, and how the curriculum moves."""

    model_config = ConfigDict(extra="forbid")

    families: list[Family] = Field(
        default_factory=lambda: ["documents"],
        description="Task families to train: any registered eval family with a rollout format.",
    )
    quotas: dict[str, float] = Field(
        default_factory=dict,
        description="Share of samples per family; missing families share the rest equally (balanced mixture).",
    )
    instances_per_family: int = Field(
        default=64, ge=1, description="Train-split instances generated per family."
    )
    seed: int = Field(default=0, description="Generator seed of the train pool (recorded in lineage).")
    start_tier: Difficulty = Field(default="easy", description="Difficulty tier the curriculum starts at.")
    promote_pass_rate: float = Field(
        default=0.7, ge=0.0, le=1.0, description="Family pass rate on its tier that moves it up a tier."
    )
    min_attempts_to_promote: int = Field(
        default=8, ge=1, description="Graded attempts needed before promotion."
    )
    tiers: bool = Field(default=True, description="Use difficulty tiers; False samples every difficulty.")
    rollout: dict[str, Literal["episode", "single_turn"]] = Field(
        default_factory=dict,
        description="Per family, how it is rolled out: 'episode' (multi-turn tool calls against the family's "
        "environment, the protocol its eval uses) or 'single_turn' (one completion: terminal then answers with "
        "one bash script). A family not listed uses 'episode' when it registers an episode environment "
        "(agent, terminal), else 'single_turn'.",
    )


class RewardConfig(BaseModel):
    """How verifier verdicts become a scalar reward in [0, 1] (outcome first)."""

    model_config = ConfigDict(extra="forbid")

    correct_weight: float = Field(default=0.7, ge=0.0, description="Weight of the verifier's `correct` flag.")
    score_weight: float = Field(default=0.2, ge=0.0, description="Weight of the verifier's partial score.")
    protocol_weight: float = Field(default=0.1, ge=0.0, description="Weight of format/protocol compliance.")
    length_penalty: float = Field(
        default=0.05, ge=0.0, description="Subtracted times the completion's fraction of its length budget."
    )
    verify: Literal["auto", "serial", "ray"] = Field(
        default="auto",
        description="Where verdicts run: Ray tasks in parallel, in process, or auto (Ray when the batch "
        "holds sandboxed terminal rollouts).",
    )


class EvalConfig(BaseModel):
    """Held-out measurement: greedy decoding on a split the policy never trains on."""

    model_config = ConfigDict(extra="forbid")

    split: Literal["dev", "test"] = Field(default="dev", description="Held-out split used during training.")
    n_per_family: int = Field(default=16, ge=1, description="Held-out instances per family.")
    seed: int = Field(default=1, description="Generator seed of the held-out set.")
    difficulty: Difficulty | None = Field(default=None, description="Only this tier; None cycles all tiers.")
    max_new_tokens: int = Field(default=64, ge=1, description="Greedy decoding budget per held-out prompt.")


class GuardConfig(BaseModel):
    """Stability and reward-hacking guards."""

    model_config = ConfigDict(extra="forbid")

    max_grad_norm: float = Field(default=1.0, gt=0.0, description="Gradient clipping norm.")
    spike_factor: float = Field(
        default=5.0, gt=1.0, description="A loss or grad-norm above this times its running median is a spike."
    )
    spike_floor: float = Field(
        default=1.0, ge=0.0, description="Medians below this count as this much (GRPO losses hover near 0)."
    )
    spike_window: int = Field(default=8, ge=2, description="Recent steps in the running median.")
    spike_min_history: int = Field(default=3, ge=1, description="Steps observed before spikes are judged.")
    max_rollbacks: int = Field(
        default=2, ge=0, description="Rollbacks allowed before the run is declared diverged."
    )
    entropy_floor: float = Field(
        default=0.05, ge=0.0, description="Mean policy entropy (nats) that raises an alert."
    )
    canary_every: int = Field(
        default=0, ge=0, description="Steps between held-out canary checks; 0 disables."
    )
    canary_patience: int = Field(
        default=2, ge=1, description="Consecutive checks with reward up and held-out down that stop the run."
    )


class TrainConfig(BaseModel):
    """Optimisation settings shared by every stage."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=50, ge=1, description="Optimizer steps.")
    learning_rate: float = Field(default=2e-5, gt=0.0, description="Peak learning rate.")
    batch_size: int = Field(default=4, ge=1, description="Per-device batch size.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    max_length: int = Field(default=1024, ge=16, description="Token budget of prompt + completion.")
    time_budget_s: float | None = Field(
        default=None, gt=0, description="Wall-clock budget of training; stops (and saves) once spent."
    )
    save_steps: int = Field(default=10, ge=1, description="Steps between checkpoints.")
    logging_steps: int = Field(default=1, ge=1, description="Steps between logged metrics.")
    seed: int = Field(default=0, description="Training seed.")
    lora: bool = Field(default=False, description="Train LoRA adapters (peft) instead of all weights.")
    lora_rank: int = Field(default=16, ge=1, description="LoRA rank.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Where training runs; auto = cuda when a GPU is visible, else cpu."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="float32", description="Training precision; auto = bfloat16 on cuda, float32 on cpu."
    )

    def resolved_device(self) -> Literal["cpu", "cuda"]:
        """``device`` with ``auto`` decided by whether torch sees a GPU."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_dtype(self) -> Literal["float32", "bfloat16"]:
        """``dtype`` with ``auto`` decided by the device (CPUs gain little from bfloat16 and lose accuracy)."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.resolved_device() == "cuda" else "float32"


class OutputConfig(BaseModel):
    """Where the run and its candidate go."""

    model_config = ConfigDict(extra="forbid")

    registry: str | None = Field(
        default=None, description="Registry URL; None uses the default file registry."
    )
    work_dir: str | None = Field(
        default=None, description="Run directory (checkpoints, trace); None = temp dir."
    )
    candidate_name: str = Field(
        default="tandem-candidate", description="Registry name of the candidate model."
    )
    version: str | None = Field(
        default=None, description="Candidate version; None derives one from the time."
    )
    publish: bool = Field(default=True, description="Publish the candidate and the run to the registry.")


class EpisodeConfig(BaseModel):
    """Multi-turn tool episodes: the policy's tool calls are parsed as the gateway parses them, the family's
    environment executes them and answers with the next ``tool`` turn, up to the step budget."""

    model_config = ConfigDict(extra="forbid")

    turn_slack: int = Field(
        default=2,
        ge=0,
        description="Model turns allowed beyond an instance's step budget (its max_steps), as the eval's tool "
        "loop allows; an episode still calling tools then is cut off.",
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="vLLM tool-call parser that reads the policy's turns; None = the serving tiers' own "
        "(EngineConfig.tool_call_parser, 'hermes'), so calls are parsed exactly as served.",
    )
    tool_timeout_s: int = Field(
        default=30, ge=1, description="Wall-clock limit of one terminal command (the eval's bash tool: 30 s)."
    )
    max_tool_output_bytes: int = Field(
        default=16 * 1024,
        ge=256,
        description="Longer tool results are truncated as Inspect truncates them in the eval (its "
        "max_tool_output default, 16 KiB).",
    )
    closing_reply: str = Field(
        default="Done.",
        min_length=1,
        description="The last assistant turn of SFT demonstrations, after the reference solution's calls.",
    )


class RunConfig(BaseModel):
    """What every algorithm's run config holds: the start model, task pool, training, held-out, guards, output."""

    model_config = ConfigDict(extra="forbid")

    base: str = Field(description="Registry ref of the model to start from, e.g. smollm2-135m-instruct@base.")
    pool: TaskPoolConfig = Field(default_factory=TaskPoolConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    episodes: EpisodeConfig = Field(default_factory=EpisodeConfig)
    guards: GuardConfig = Field(default_factory=GuardConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    evaluate_before_after: bool = Field(
        default=True, description="Measure held-out pass rate before and after."
    )
