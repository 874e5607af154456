"""On-policy distillation loop (DistillSpec): the draft samples, the teacher scores, the draft moves closer.

Why our own loop rather than TRL's ``GKDTrainer``: measured on this shared 2-core CPU with the same
teacher, draft, batch (8 prompts x 64 on-policy tokens) and loss (JSD, beta 0.5), the lean loop took a
median 119 s per step against GKDTrainer's 386 s (3.2x; both starved at nice 19 under a load average
above 10, so only the ratio means anything); see ``bench/results/distill_gkd_comparison.json``, made by
``python -m bench.gkd_comparison``. The gain comes from running the LM head only on completion
positions, bf16 autocast, frozen tied embeddings and no Trainer machinery. The loss family is the same
(GKD's generalised JSD, FKL, RKL, plus TVD).
"""

from __future__ import annotations

import logging
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from distill.acceptance import AcceptanceReport, measure_acceptance
from distill.config import DistillConfig, Divergence
from distill.divergence import DIVERGENCES
from distill.errors import CheckpointError
from distill.sequences import CompletionBatch, completion_logits, encode_prompts, generate_completions

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass
class TrainingHistory:
    """Loss per step and acceptance at each evaluation, kept in checkpoints and plotted at the end."""

    losses: list[tuple[int, float]] = field(default_factory=list)
    evaluations: list[tuple[int, float, float]] = field(default_factory=list)  # step, expected, greedy

    def to_json(self) -> dict[str, Any]:
        return {"losses": self.losses, "evaluations": self.evaluations}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainingHistory:
        return cls(
            losses=[(int(s), float(v)) for s, v in data.get("losses", [])],
            evaluations=[(int(s), float(e), float(g)) for s, e, g in data.get("evaluations", [])],
        )


class DraftDistiller:
    """Holds teacher, draft, optimizer and data; trains the draft one step at a time, resumably."""

    def __init__(
        self,
        config: DistillConfig,
        teacher: Any,
        draft: Any,
        tokenizer: Any,
        train_prompts: list[str],
        eval_batches: list[CompletionBatch],
    ) -> None:
        self.config = config
        self.teacher = teacher.eval().requires_grad_(False)
        self.draft = draft
        self.tokenizer = tokenizer
        self.train_prompts = train_prompts
        self.eval_batches = eval_batches
        self.autocast_dtype = torch.bfloat16 if config.compute_dtype == "bfloat16" else None
        embeddings = draft.get_input_embeddings().weight
        if not config.train_embeddings:
            embeddings.requires_grad_(False)  # tied with the LM head: stays identical to the teacher's
        self.parameters = [p for p in draft.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.parameters, lr=config.learning_rate, weight_decay=config.weight_decay, betas=(0.9, 0.98)
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0
        self.history = TrainingHistory()
        self.rng = random.Random(config.seed)
        torch.manual_seed(config.seed)

    def _lr_factor(self, step: int) -> float:
        """Linear warm-up, then cosine decay to 10% over ``config.steps``."""
        warmup = self.config.warmup_steps
        if step < warmup:
            return (step + 1) / warmup
        span = max(self.config.steps - warmup, 1)
        progress = min((step - warmup) / span, 1.0)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    def _autocast(self) -> torch.autocast:
        device = next(self.draft.parameters()).device.type  # where the models live, from their config
        return torch.autocast(
            device, dtype=self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None
        )

    def train_step(self, divergence: Divergence) -> float:
        """One optimizer step on a fresh batch of continuations; returns the mean token loss."""
        prompts = self.rng.sample(self.train_prompts, min(self.config.batch_size, len(self.train_prompts)))
        encoded = encode_prompts(self.tokenizer, prompts, self.config.max_prompt_tokens)
        on_policy = self.rng.random() < self.config.on_policy_fraction
        with self._autocast():
            batch = generate_completions(
                self.draft if on_policy else self.teacher,
                self.tokenizer,
                encoded,
                self.config.max_new_tokens,
                sample=on_policy,
                temperature=self.config.sample_temperature,
            )
            with torch.no_grad():
                teacher_logits = completion_logits(self.teacher, batch)
            self.draft.train()
            draft_logits = completion_logits(self.draft, batch)
        mask = batch.completion_mask.bool()
        loss = DIVERGENCES[divergence](teacher_logits[mask], draft_logits[mask], self.config.jsd_beta).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        value = float(loss.item())
        self.history.losses.append((self.step, value))
        return value

    def evaluate(self) -> AcceptanceReport:
        report = measure_acceptance(
            self.teacher, self.draft, self.eval_batches, autocast_dtype=self.autocast_dtype
        )
        self.history.evaluations.append((self.step, report.expected_acceptance, report.greedy_agreement))
        log.info(
            "event=distill_eval step=%d expected_acceptance=%.4f greedy_agreement=%.4f",
            self.step,
            report.expected_acceptance,
            report.greedy_agreement,
        )
        return report

    # -- checkpoints ----------------------------------------------------------------------------------
    def save_checkpoint(self, directory: Path, extra: dict[str, Any] | None = None) -> None:
        """Atomically write weights, optimizer, scheduler, RNG state and history to ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "digest": self.config.config_digest(),
            "step": self.step,
            "draft": {k: v for k, v in self.draft.state_dict().items() if k != "lm_head.weight"},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng_python": self.rng.getstate(),
            "rng_torch": torch.get_rng_state(),
            "history": self.history.to_json(),
            "extra": extra or {},
        }
        partial = directory / (CHECKPOINT_NAME + ".partial")
        torch.save(state, partial)
        os.replace(partial, directory / CHECKPOINT_NAME)
        log.info("event=distill_checkpoint step=%d path=%s", self.step, directory / CHECKPOINT_NAME)

    def load_checkpoint(self, directory: Path, *, check_digest: bool = True) -> dict[str, Any]:
        """Restore state saved by :meth:`save_checkpoint`; refuses one made with a different config."""
        path = directory / CHECKPOINT_NAME
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except (OSError, RuntimeError, EOFError) as exc:
            raise CheckpointError(f"{path}: cannot read checkpoint: {exc}") from exc
        if check_digest and state["digest"] != self.config.config_digest():
            changed = sorted(
                k for k in state["digest"] if state["digest"].get(k) != self.config.config_digest().get(k)
            )
            raise CheckpointError(
                f"{path} was written with a different configuration (fields {changed}); "
                "use another work_dir or restore those settings"
            )
        self.draft.load_state_dict(state["draft"], strict=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.setstate(state["rng_python"])
        torch.set_rng_state(state["rng_torch"])
        self.step = int(state["step"])
        self.history = TrainingHistory.from_json(state["history"])
        log.info("event=distill_resume step=%d path=%s", self.step, path)
        return dict(state.get("extra", {}))


def has_checkpoint(directory: Path) -> bool:
    return (directory / CHECKPOINT_NAME).is_file()
