"""SFT on demonstrations the generators know to be right, mixed across families by quota (TRL SFTTrainer,
full weights or LoRA)."""

from __future__ import annotations

import logging
from typing import Any

from evalsuite.schema import TaskInstance
from infra.errors import ConfigError
from posttrain.common import StageContext, before_after
from posttrain.formats import format_for
from posttrain.run import CandidateResult
from posttrain.stages import SFTRunConfig
from posttrain.trace import RolloutRecord

log = logging.getLogger(__name__)


def demonstration_rows(context: StageContext, n: int) -> list[dict[str, Any]]:
    """``n`` prompt/completion conversations interleaving families by quota; each traced."""
    rows = []
    for index, instance_id in enumerate(context.pool.balanced(n)):
        instance = context.pool.instance(instance_id)
        rollout = format_for(instance.family)
        prompt, answer = rollout.messages(instance), rollout.demonstration(instance)
        rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": answer}]})
        if context.trace.count < n:
            context.trace.write(
                RolloutRecord(
                    stage="sft",
                    policy_version=0,
                    instance_id=instance_id,
                    family=instance.family,
                    difficulty=instance.difficulty,
                    group=index,
                    prompt=prompt,
                    sampling={"source": "demonstration"},
                    completion=answer,
                    reward=1.0,
                    correct=True,
                )
            )
    return rows


def _require_room_for_answers(rows: list[dict[str, Any]], tokenizer: Any, max_length: int) -> None:
    """Refuse a run whose every prompt fills ``max_length``: TRL would truncate each answer away, drop every
    example as fully masked, and fail deep in the sampler instead of naming the setting."""
    lengths = [
        len(tokenizer.apply_chat_template(row["prompt"], tokenize=True, return_dict=True)["input_ids"])
        for row in rows
    ]
    if lengths and min(lengths) >= max_length:
        raise ConfigError(
            f"train.max_length={max_length} leaves no room for any answer: the shortest of {len(rows)} prompts "
            f"is {min(lengths)} tokens (longest {max(lengths)}); raise train.max_length above {max(lengths)}"
        )


def posttrain_sft(
    config: SFTRunConfig,
    resume: bool = True,
    instances: list[TaskInstance] | None = None,
    extra_callbacks: list[Any] | None = None,
) -> CandidateResult:
    """Fine-tune ``config.base`` on train-split demonstrations; publish a candidate with lineage."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    context = StageContext(config, "sft", instances)
    tokenizer = context.load_tokenizer()
    train = config.train
    rows = demonstration_rows(context, train.max_steps * train.batch_size * train.gradient_accumulation_steps)
    _require_room_for_answers(rows, tokenizer, train.max_length)
    dataset = Dataset.from_list(rows)
    before = context.held_out(context.load_model(), tokenizer) if config.evaluate_before_after else None

    def make_trainer(callbacks: list[Any], replay: int) -> Any:
        args = SFTConfig(
            **context.trainer_args(replay), max_length=train.max_length, completion_only_loss=True
        )
        return context.trl_trainer(SFTTrainer, args, tokenizer, callbacks, train_dataset=dataset)

    trainer, guarded = context.train(make_trainer, resume, extra_callbacks=extra_callbacks)
    after = context.held_out(trainer.model, tokenizer) if config.evaluate_before_after else None
    metrics = {
        "steps": guarded.steps,
        "rollbacks": guarded.rollbacks,
        "demonstrations_prepared": len(rows),
        "demonstrations_seen": guarded.steps * train.batch_size * train.gradient_accumulation_steps,
        "final_loss": next((r["loss"] for r in reversed(guarded.history) if "loss" in r), None),
        **before_after(before, after),
    }
    return context.finish(trainer, tokenizer, guarded.history, metrics)
