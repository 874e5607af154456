"""``DistillConfig``: every tunable of draft distillation, documented where it is declared."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

Divergence = Literal["fkl", "rkl", "jsd", "tvd"]


class DistillConfig(BaseModel):
    """Configuration of :func:`distill.distill_draft` (DistillSpec-style on-policy distillation)."""

    teacher: str = Field(description="Registry ref of the target model ('name@version').")
    registry_url: str | None = Field(
        default=None, description="Registry URL; None uses open_registry()'s default."
    )
    keep_layers: list[int] | None = Field(
        default=None,
        description="Teacher layer indices copied into the draft; None spreads num_layers evenly.",
    )
    num_layers: int = Field(default=4, ge=1, description="Draft depth when keep_layers is not given.")
    init_from: str | None = Field(
        default=None,
        description="Start from an existing draft (registry ref or directory) instead of a layer subset; "
        "its tokenizer must match the teacher's.",
    )
    steps: int = Field(default=300, ge=0, description="Optimizer steps of the main run.")
    batch_size: int = Field(
        default=8, ge=1, description="Prompts per step; each yields one sampled continuation."
    )
    max_new_tokens: int = Field(default=64, ge=1, description="Length of each on-policy continuation.")
    max_prompt_tokens: int = Field(default=96, ge=8, description="Prompts are truncated on the left to this.")
    on_policy_fraction: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Share of steps whose continuations the draft samples (the rest: teacher greedy, as in GKD's lmbda).",
    )
    sample_temperature: float = Field(
        default=1.0, gt=0.0, description="Temperature of the draft's own samples."
    )
    divergence: Divergence | Literal["auto"] = Field(
        default="auto",
        description="Token-level divergence; 'auto' runs each of divergence_candidates for sweep_steps and keeps "
        "the one with the highest held-out acceptance.",
    )
    divergence_candidates: list[Divergence] = Field(
        default_factory=lambda: list[Divergence](["fkl", "jsd", "tvd"]),
        description="Divergences tried by the 'auto' sweep.",
    )
    sweep_steps: int = Field(default=30, ge=1, description="Steps per candidate when divergence='auto'.")
    jsd_beta: float = Field(default=0.5, gt=0.0, lt=1.0, description="Mixture weight of the generalised JSD.")
    learning_rate: float = Field(default=3e-4, gt=0.0)
    warmup_steps: int = Field(default=10, ge=0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    train_embeddings: bool = Field(
        default=False, description="False keeps the (tied) embeddings frozen, identical to the teacher's."
    )
    compute_dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16", description="Autocast dtype for teacher scoring and draft forward passes."
    )
    eval_every: int = Field(default=25, ge=1, description="Steps between held-out acceptance measurements.")
    eval_prompts: int = Field(default=24, ge=1, description="Held-out prompts used for acceptance.")
    eval_new_tokens: int = Field(
        default=64, ge=1, description="Teacher greedy tokens scored per held-out prompt."
    )
    checkpoint_every: int = Field(default=10, ge=1, description="Steps between resumable checkpoints.")
    work_dir: Path | None = Field(
        default=None, description="Checkpoints and outputs; default under TANDEM_HOME."
    )
    prompts_file: Path | None = Field(default=None, description="JSONL prompts; default: the bundled set.")
    name: str | None = Field(default=None, description="Draft artifact name; default '<teacher name>-draft'.")
    version: str | None = Field(default=None, description="Draft artifact version; default a UTC timestamp.")
    publish: bool = Field(default=True, description="Publish the draft to the registry when done.")
    cost_ratio: float | None = Field(
        default=None, ge=0.0, description="Draft/target step cost c for choosing k; None measures it."
    )
    max_speculative_tokens: int = Field(default=8, ge=1)
    seed: int = 0
    threads: int | None = Field(default=None, ge=1, description="torch threads; None keeps torch's default.")

    @field_validator("keep_layers")
    @classmethod
    def _distinct_sorted(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("keep_layers must name at least one layer")
        if len(set(value)) != len(value) or any(v < 0 for v in value):
            raise ValueError("keep_layers must be distinct non-negative layer indices")
        return sorted(value)

    def config_digest(self) -> dict[str, object]:
        """The fields that must match for a checkpoint to be resumed."""
        return self.model_dump(
            mode="json",
            include={
                "teacher",
                "keep_layers",
                "num_layers",
                "init_from",
                "batch_size",
                "max_new_tokens",
                "max_prompt_tokens",
                "on_policy_fraction",
                "divergence",
                "divergence_candidates",
                "sweep_steps",
                "jsd_beta",
                "learning_rate",
                "train_embeddings",
                "seed",
            },
        )
