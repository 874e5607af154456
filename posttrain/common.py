"""What every trainer shares: model loading on the configured device and precision, TRL argument defaults,
building a TRL trainer, the guarded training loop, held-out measurement, and the end-of-run bookkeeping
(trace seal, curves, candidate export). A trainer adds only its data and its TRL config/trainer classes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalsuite.schema import TaskInstance
from infra.config import write_json
from posttrain.checkpoints import config_digest
from posttrain.config import RunConfig
from posttrain.evaluation import HeldOutReport, measure_held_out
from posttrain.pool import TaskPool
from posttrain.run import (
    CandidateResult,
    open_output_registry,
    publish_candidate,
    resolve_base,
    run_directory,
    save_curves,
)
from posttrain.trace import TraceWriter

log = logging.getLogger(__name__)


class StageContext:
    """Resolved inputs of one stage run: base weights, run dir, pool, trace, registry."""

    def __init__(self, config: RunConfig, stage: str, instances: list[TaskInstance] | None = None) -> None:
        self.config = config
        self.stage = stage
        self.registry = open_output_registry(config.output)
        self.base_dir = resolve_base(config.base, self.registry)
        self.run_dir = run_directory(config.output, stage)
        self.pool = TaskPool(config.pool, instances)
        self.trace = TraceWriter(self.run_dir)
        self.digest = config_digest(config)
        write_json(self.run_dir / "config.json", config.model_dump(mode="json"))

    def load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.base_dir)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def load_model(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        dtype = torch.float32 if self.config.train.resolved_dtype() == "float32" else torch.bfloat16
        return AutoModelForCausalLM.from_pretrained(self.base_dir, dtype=dtype)

    def peft_config(self) -> Any:
        if not self.config.train.lora:
            return None
        from peft import LoraConfig

        rank = self.config.train.lora_rank
        return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")

    def trainer_args(self, replay: int = 0) -> dict[str, Any]:
        """The Trainer's arguments; ``replay`` (rollbacks so far) reshuffles the data after a rollback."""
        train = self.config.train
        return {
            "output_dir": str(self.run_dir),
            "max_steps": train.max_steps,
            "learning_rate": train.learning_rate,
            "per_device_train_batch_size": train.batch_size,
            "gradient_accumulation_steps": train.gradient_accumulation_steps,
            "max_grad_norm": self.config.guards.max_grad_norm,
            "logging_steps": train.logging_steps,
            "save_steps": train.save_steps,
            "save_total_limit": 3,
            "seed": train.seed,
            # The same seed would feed the same batches again and reproduce the spike that caused the
            # rollback (a spike is often the data); a new order of the same data goes past it. Still a pure
            # function of the run state, so resuming after a crash stays exact.
            "data_seed": train.seed + 1000 * replay,
            "report_to": "none",
            "use_cpu": train.resolved_device() == "cpu",
            "bf16": train.resolved_dtype() == "bfloat16",
            "dataloader_num_workers": 0,
        }

    def trl_trainer(
        self, trainer_class: Any, args: Any, tokenizer: Any, callbacks: list[Any], **data: Any
    ) -> Any:
        """A TRL trainer on a fresh copy of the base weights, with this run's tokenizer, LoRA and callbacks."""
        return trainer_class(
            model=self.load_model(),
            args=args,
            processing_class=tokenizer,
            peft_config=self.peft_config(),
            callbacks=callbacks,
            **data,
        )

    def train(self, make_trainer: Callable[[list[Any], int], Any], resume: bool, **guard_options: Any) -> Any:
        """Train under the guards (checkpoints, rollbacks, time budget); returns ``(trainer, GuardedRun)``."""
        from posttrain.guards import train_guarded

        return train_guarded(
            make_trainer,
            self.run_dir,
            self.digest,
            self.config.guards,
            self.trace,
            self.stage,
            resume=resume,
            time_budget_s=self.config.train.time_budget_s,
            **guard_options,
        )

    def held_out(self, model: Any, tokenizer: Any) -> HeldOutReport:
        config = self.config
        return measure_held_out(
            model,
            tokenizer,
            config.eval,
            list(config.pool.families),
            rollout=config.pool.rollout,
            episodes=config.episodes,
            max_total_tokens=config.train.max_length,
        )

    def finish(
        self,
        trainer: Any,
        tokenizer: Any,
        history: list[dict[str, float]],
        metrics: dict[str, Any],
    ) -> CandidateResult:
        """Save the final model, seal the trace, draw curves and publish the candidate."""
        model = trainer.model
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        model_dir = self.run_dir / "candidate"
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        self.trace.seal()
        write_json(self.run_dir / "history.json", history)
        save_curves(history, self.run_dir / "curves.png", f"tandem posttrain {self.stage}")
        write_json(self.run_dir / "metrics.json", metrics)
        candidate_ref = run_ref = None
        if self.config.output.publish:
            candidate_ref, run_ref = publish_candidate(
                self.config.output,
                self.registry,
                self.stage,
                model_dir,
                self.run_dir,
                self.config.base,
                self.config,
                self.pool.task_set(),
                metrics,
            )
        return CandidateResult(
            stage=self.stage,
            model_dir=str(model_dir),
            run_dir=str(self.run_dir),
            candidate_ref=candidate_ref,
            run_ref=run_ref,
            metrics=metrics,
        )


def before_after(before: HeldOutReport | None, after: HeldOutReport | None) -> dict[str, Any]:
    if before is None or after is None:
        return {}
    return {
        "held_out_split": after.split,
        "held_out_seed": after.seed,
        "held_out_n": after.n,
        "pass_rate_before": before.pass_rate,
        "pass_rate_after": after.pass_rate,
        "pass_rate_delta": {f: after.pass_rate[f] - before.pass_rate.get(f, 0.0) for f in after.pass_rate},
    }


def history_path(run_dir: Path) -> Path:
    return run_dir / "history.json"
