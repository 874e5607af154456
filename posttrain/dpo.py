"""DPO (TRL DPOTrainer) on pairs the verifiers label: sample rollouts per prompt from the base policy,
chosen = verified correct, rejected = verified wrong, same prompt."""

from __future__ import annotations

import logging
from typing import Any

from evalsuite.schema import TaskInstance
from posttrain.common import StageContext, before_after
from posttrain.formats import format_for
from posttrain.run import CandidateResult
from posttrain.stages import DPORunConfig
from posttrain.trace import RolloutRecord
from posttrain.verify import verify_batch

log = logging.getLogger(__name__)


def sample_completions(
    model: Any,
    tokenizer: Any,
    messages: list[dict[str, str]],
    n: int,
    max_new_tokens: int,
    temperature: float,
) -> list[str]:
    """``n`` sampled completions of one chat prompt."""
    import torch

    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    batch = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
    with torch.no_grad():
        generated = model.generate(
            **batch,
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            pad_token_id=tokenizer.pad_token_id,
        )
    return list(tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True))


def preference_pairs(
    context: StageContext, config: DPORunConfig, model: Any, tokenizer: Any
) -> list[dict[str, Any]]:
    """Verifier-labelled pairs, one per prompt that has both a correct and a wrong candidate."""
    import torch

    torch.manual_seed(config.train.seed)
    sampling = {
        "temperature": config.temperature,
        "max_completion_length": config.max_completion_length,
        "samples_per_prompt": config.samples_per_prompt,
    }
    train = config.train
    pairs = []
    for group, instance_id in enumerate(context.pool.balanced(train.max_steps * train.batch_size)):
        instance = context.pool.instance(instance_id)
        rollout = format_for(instance.family)
        prompt = rollout.messages(instance)
        correct: list[str] = []
        wrong: list[str] = []
        texts = sample_completions(
            model,
            tokenizer,
            prompt,
            config.samples_per_prompt,
            config.max_completion_length,
            config.temperature,
        )
        verdicts = verify_batch([instance] * len(texts), texts)
        for text, (result, protocol) in zip(texts, verdicts, strict=True):
            (correct if result.correct else wrong).append(text)
            context.trace.write(
                RolloutRecord(
                    stage="dpo",
                    policy_version=0,
                    instance_id=instance_id,
                    family=instance.family,
                    difficulty=instance.difficulty,
                    group=group,
                    prompt=prompt,
                    sampling=sampling,
                    completion=text,
                    reward=result.score,
                    components={**result.components, "protocol": protocol},
                    correct=result.correct,
                    explanation=result.explanation,
                )
            )
        context.pool.record_group(instance_id, [True] * len(correct) + [False] * len(wrong))
        if not correct and config.use_reference_demos:
            correct = _verified_demonstration(instance)
        if correct and wrong:
            pairs.append(
                {
                    "prompt": prompt,
                    "chosen": [{"role": "assistant", "content": correct[0]}],
                    "rejected": [{"role": "assistant", "content": wrong[0]}],
                    "instance_id": instance_id,
                }
            )
    log.info("event=dpo_pairs pairs=%d prompts=%d", len(pairs), train.max_steps * train.batch_size)
    return pairs


def _verified_demonstration(instance: TaskInstance) -> list[str]:
    rollout = format_for(instance.family)
    demonstration = rollout.demonstration(instance)
    result, _ = rollout.score(instance, demonstration)
    return [demonstration] if result.correct else []


def posttrain_dpo(
    config: DPORunConfig, resume: bool = True, instances: list[TaskInstance] | None = None
) -> CandidateResult:
    """DPO from ``config.base`` on verifier-labelled pairs; publish the candidate with lineage and trace."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from posttrain.errors import PosttrainError

    context = StageContext(config, "dpo", instances)
    tokenizer = context.load_tokenizer()
    base = context.load_model()
    before = context.held_out(base, tokenizer) if config.evaluate_before_after else None
    pairs = preference_pairs(context, config, base, tokenizer)
    if not pairs:
        raise PosttrainError(
            "dpo: no prompt produced both a verified-correct and a verified-wrong completion"
        )
    dataset = Dataset.from_list(pairs)

    def make_trainer(callbacks: list[Any], replay: int) -> Any:
        args = DPOConfig(**context.trainer_args(replay), beta=config.beta, max_length=config.train.max_length)
        return context.trl_trainer(DPOTrainer, args, tokenizer, callbacks, train_dataset=dataset)

    trainer, guarded = context.train(make_trainer, resume)
    after = context.held_out(trainer.model, tokenizer) if config.evaluate_before_after else None
    metrics = {
        "steps": guarded.steps,
        "rollbacks": guarded.rollbacks,
        "pairs": len(pairs),
        "rollouts_traced": context.trace.count,
        **before_after(before, after),
    }
    return context.finish(trainer, tokenizer, guarded.history, metrics)
