"""``Eagle3Config``: every tunable of EAGLE-3 head training, documented where it is declared."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from infra.config import config_digest


class Eagle3Config(BaseModel):
    """Configuration of :func:`distill.eagle3.train_eagle3_head`."""

    teacher: str = Field(description="Registry ref of the target model ('name@version').")
    registry_url: str | None = Field(
        default=None, description="Registry URL; None uses open_registry()'s default."
    )
    work_dir: Path | None = Field(
        default=None,
        description="Data, features and checkpoints; default under TANDEM_HOME. Rerun to resume.",
    )
    # Data: the target's own greedy answers to self-made prompts.
    template_prompts: int = Field(2500, ge=0, description="Template x topic prompts in the training set.")
    self_prompts: int = Field(
        1500, ge=0, description="User turns the target samples itself (temperature 1) as further prompts."
    )
    extra_prompts: int = Field(
        0,
        ge=0,
        description="Further template prompts (a second template and topic bank) appended after the base "
        "set: a later round with more data reuses every shard already generated.",
    )
    task_prompts: int = Field(
        0,
        ge=0,
        description="Requests of the kinds the topic banks lack (code, SQL, regular expressions, shell, "
        "translation, arithmetic, conversions, short facts, practical writing), appended after the extra "
        "bank: about 1,800 exist.",
    )
    max_prompts: int | None = Field(
        None,
        ge=1,
        description="Answer only the first N training prompts (a seeded random subset): the budget knob.",
    )
    skip_prompts: int = Field(
        0,
        ge=0,
        description="Leave out the first N training prompts (those an init_from head has already learned): "
        "a continuation round answers and trains on prompts new to the head only.",
    )
    max_new_tokens: int = Field(256, ge=8, description="Greedy completion length per training prompt.")
    max_seq_len: int = Field(512, ge=32, description="Prompt + completion tokens kept per sequence.")
    generation_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="vLLM dtype for data generation: the served tiers' dtype, so labels match them.",
    )
    generation_kv_cache_bytes: int = Field(
        2 << 30, ge=1 << 20, description="vLLM KV-cache budget for generation."
    )
    # Head.
    draft_vocab_size: int = Field(
        16384, ge=16, description="Reduced draft vocabulary (most frequent outputs)."
    )
    aux_layers: list[int] | None = Field(
        None, description="Target layers fused by fc (vLLM aux ids); None: vLLM's default (2, L/2, L-3)."
    )
    head_layers: int = Field(
        1,
        ge=1,
        le=4,
        description="Decoder layers of the head. With init_from, a head of fewer layers keeps its weights and "
        "gains zero-initialised layers that start as the identity (it drafts as before until trained).",
    )
    init_from: str | None = Field(
        None,
        description="Registry ref of an EAGLE-3 draft of the same teacher to continue training: its "
        "weights and draft vocabulary replace the fresh head (more data or steps for a published head); a "
        "larger draft_vocab_size grows that vocabulary.",
    )
    # Training.
    speculative_steps: int = Field(
        4, ge=1, le=8, description="Draft steps unrolled in training (>= serving k)."
    )
    epochs: int = Field(2, ge=1)
    tokens_per_batch: int = Field(4096, ge=64, description="Padded tokens per optimizer step.")
    learning_rate: float = Field(1e-3, gt=0.0)
    warmup_steps: int = Field(30, ge=0)
    step_weight_decay: float = Field(
        0.8, gt=0.0, le=1.0, description="Loss weight of draft step j is decay**j (EAGLE-3's recipe)."
    )
    soft_labels: bool = Field(
        True,
        description="Train against the target's next-token distribution over the draft vocabulary "
        "(EAGLE-3's loss) rather than the one-hot greedy token.",
    )
    compute_dtype: Literal["bfloat16", "float32"] = Field(
        "bfloat16", description="Autocast dtype for feature extraction and training."
    )
    device: str = Field("auto", description="'auto' (cuda when available, else cpu), 'cpu' or 'cuda[:n]'.")
    eval_every: int = Field(100, ge=1, description="Optimizer steps between held-out acceptance estimates.")
    checkpoint_every: int = Field(25, ge=1, description="Optimizer steps between resumable checkpoints.")
    time_budget_s: float | None = Field(
        None, gt=0, description="Stop training after this much training time (counted across resumes)."
    )
    max_speculative_tokens: int = Field(6, ge=1, description="Largest k considered when choosing k.")
    cost_ratio: float | None = Field(
        None, ge=0.0, description="Draft/target step cost c for choosing k; None measures it here."
    )
    seed: int = 0
    threads: int | None = Field(None, ge=1, description="torch threads; None keeps torch's default.")
    name: str | None = Field(None, description="Draft artifact name; default '<teacher name>-eagle3'.")
    version: str | None = Field(None, description="Draft artifact version; default a UTC timestamp.")
    publish: bool = Field(True, description="Publish the head to the registry when done.")

    def data_digest(self) -> str:
        """What the generated data depends on: a different digest means a different data directory.

        ``max_prompts``, ``extra_prompts`` and ``task_prompts`` are left out on purpose: a larger budget extends the same
        shards. ``skip_prompts`` is too: its answers and features go to directories of their own
        (:meth:`train_data_suffix`), beside the held-out set they share.
        """
        fields = {"teacher", "template_prompts", "self_prompts", "max_new_tokens", "generation_dtype", "seed"}
        return config_digest(self, include=fields)[:10]

    def train_data_suffix(self) -> str:
        """Suffix of the training answers' and features' directories: a round that skips prompts starts
        its shards at another prompt, so it must not read (or overwrite) the full round's."""
        return f"-from-{self.skip_prompts}" if self.skip_prompts else ""

    def train_digest(self) -> str:
        """What a training checkpoint depends on; resuming with another digest is refused."""
        fields = {
            "teacher", "template_prompts", "self_prompts", "extra_prompts", "max_prompts", "max_new_tokens",
            "max_seq_len",
            "draft_vocab_size", "aux_layers", "speculative_steps", "epochs", "tokens_per_batch",
            "learning_rate", "warmup_steps", "step_weight_decay", "seed", "soft_labels", "init_from",
            *(("head_layers",) if self.head_layers != 1 else ()),
            *(("skip_prompts",) if self.skip_prompts else ()),
            *(("task_prompts",) if self.task_prompts else ()),
        }  # fmt: skip
        return config_digest(self, include=fields)[:10]
