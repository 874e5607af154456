"""SFT on demonstrations the generators know to be right, mixed across families by quota (TRL SFTTrainer,
full weights or LoRA)."""

from __future__ import annotations

import logging
from typing import Any

from evalsuite.schema import TaskInstance
from infra.errors import ConfigError
from posttrain.common import StageContext, before_after
from posttrain.episodes import Episode, demonstration, require_room_for_turns
from posttrain.errors import PosttrainError
from posttrain.formats import format_for
from posttrain.run import CandidateResult
from posttrain.stages import SFTRunConfig
from posttrain.trace import RolloutRecord

log = logging.getLogger(__name__)


def demonstration_rows(context: StageContext, n: int, tokenizer: Any = None) -> list[dict[str, Any]]:
    """``n`` demonstrations interleaving families by quota; each traced.

    Single-turn families give prompt/completion conversations. When the pool holds a family rolled out as
    episodes, every row is a token sequence with an ``assistant_masks`` column instead (TRL builds the labels
    from it): episode families give their reference solution played through the real environment (tool-call
    turns as the chat template renders them, real tool results), single-turn families their answer turn."""
    pool = context.pool
    episodic = any(pool.uses_episodes(family) for family in pool.config.families)
    if episodic and tokenizer is None:
        raise ValueError("demonstration_rows needs the tokenizer when the pool holds episode families")
    played: dict[str, Episode | None] = {}
    rows: list[dict[str, Any]] = []
    for index, instance_id in enumerate(pool.balanced(n)):
        instance = pool.instance(instance_id)
        if pool.uses_episodes(instance.family):
            if instance_id not in played:
                played[instance_id] = _played_demonstration(context, instance, tokenizer)
            episode = played[instance_id]
            if episode is None:
                continue
            prompt, answer = (
                episode.prompt,
                str(tokenizer.decode(episode.completion_ids, skip_special_tokens=False)),
            )
            rows.append(
                {
                    "input_ids": episode.prompt_ids + episode.completion_ids,
                    "assistant_masks": [0] * len(episode.prompt_ids) + episode.loss_mask,
                }
            )
        else:
            rollout = format_for(instance.family)
            prompt, answer = rollout.messages(instance), rollout.demonstration(instance)
            completion = [{"role": "assistant", "content": answer}]
            rows.append(
                _answer_tokens(tokenizer, prompt, completion)
                if episodic
                else {"prompt": prompt, "completion": completion}
            )
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
    if skipped := [i for i, episode in played.items() if episode is None]:
        log.warning("event=demonstrations_skipped count=%d instances=%s", len(skipped), skipped[:5])
    if not rows:
        raise PosttrainError(
            "no demonstration fits: every reference episode failed its verifier (see the log)"
        )
    return rows


def _played_demonstration(context: StageContext, instance: TaskInstance, tokenizer: Any) -> Episode | None:
    """The instance's reference episode, or None (logged) when it does not reach a correct verdict within
    ``train.max_length`` tokens: an SFT row must demonstrate success."""
    config = context.config
    episode = demonstration(instance, tokenizer, config.episodes, config.train.max_length)
    if not episode.verdict.correct:
        log.warning(
            "event=demonstration_not_correct instance=%s ended=%s explanation=%s",
            instance.instance_id,
            episode.ended,
            episode.verdict.explanation,
        )
        return None
    return episode


def _answer_tokens(
    tokenizer: Any, prompt: list[dict[str, Any]], completion: list[dict[str, Any]]
) -> dict[str, Any]:
    """A single-turn demonstration as tokens: the prompt (masked) then the answer turn as the template renders it."""
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    prompt_ids = tokenizer(head, add_special_tokens=False).input_ids
    answer_ids = tokenizer(whole[len(head) :], add_special_tokens=False).input_ids
    return {
        "input_ids": prompt_ids + answer_ids,
        "assistant_masks": [0] * len(prompt_ids) + [1] * len(answer_ids),
    }


def _require_room_for_answers(rows: list[dict[str, Any]], tokenizer: Any, max_length: int) -> None:
    """Refuse a run whose every prompt fills ``max_length``: TRL would truncate each answer away, drop every
    example as fully masked, and fail deep in the sampler instead of naming the setting."""
    lengths = [
        row["assistant_masks"].index(1)
        if "assistant_masks" in row
        else len(tokenizer.apply_chat_template(row["prompt"], tokenize=True, return_dict=True)["input_ids"])
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
    require_room_for_turns(
        [i for i in context.pool.instances.values() if context.pool.uses_episodes(i.family)],
        tokenizer,
        config.episodes.tool_call_parser,
        train.max_length,
        "train.max_length",
    )
    rows = demonstration_rows(
        context, train.max_steps * train.batch_size * train.gradient_accumulation_steps, tokenizer
    )
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
