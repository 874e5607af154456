"""DPO (TRL DPOTrainer) on preference pairs from two sources (``DPORunConfig.pairs``):

- ``verifier``: sample rollouts per prompt from the base policy, chosen = verified correct, rejected = verified
  wrong, same prompt;
- ``reviews:<session>[@version]``: human blind-review preferences, the registry artifact ``reviews-<session>``
  (kind ``preferences``, file ``pairs.jsonl`` of :class:`PreferencePair` rows) that
  ``tandem review export --session <session> --pairs`` publishes. Read from the registry, never the review database.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, Field, ValidationError

from evalsuite.schema import TaskInstance
from infra.errors import ArtifactNotFound
from posttrain.common import StageContext, before_after
from posttrain.errors import PosttrainError
from posttrain.formats import format_for
from posttrain.run import CandidateResult
from posttrain.stages import DPORunConfig
from posttrain.trace import RolloutRecord
from posttrain.verify import verify_batch

if TYPE_CHECKING:
    from infra.registry import Registry

log = logging.getLogger(__name__)

PREFERENCES_KIND: Final = "preferences"
PREFERENCES_FILE = "pairs.jsonl"
REVIEWS_SOURCE = "reviews:"


class PreferenceMessage(BaseModel):
    role: str
    content: str


class PreferencePair(BaseModel):
    """One row of a preferences artifact's ``pairs.jsonl`` (TRL's conversational preference format)."""

    prompt: list[PreferenceMessage] = Field(min_length=1, description="The chat up to the answer.")
    chosen: list[PreferenceMessage] = Field(
        min_length=1, description="The preferred answer (assistant turn)."
    )
    rejected: list[PreferenceMessage] = Field(min_length=1, description="The dispreferred answer.")
    pair_id: str = Field(default="", description="Where the pair came from (e.g. the review pair id).")


def review_artifact_name(session_id: str) -> str:
    """The registry name of a review session's preferences: ``reviews-<session>``."""
    return f"reviews-{session_id}"


def review_pairs(registry: Registry, source: str) -> tuple[str, list[PreferencePair]]:
    """The pairs of ``reviews:<session>[@version]`` (newest version by default) and the ref read.

    An unknown session, a wrong artifact kind or a malformed row is a PosttrainError naming it.
    """
    session, _, version = source.removeprefix(REVIEWS_SOURCE).partition("@")
    name = review_artifact_name(session)
    try:
        manifest = registry.manifest(f"{name}@{version}" if version else name)
    except ArtifactNotFound as exc:
        raise PosttrainError(
            f"dpo --pairs {source}: no review preferences {name}{'@' + version if version else ''} in "
            f"{registry.url}; publish them with `tandem review export --session {session} --pairs`"
        ) from exc
    if manifest.kind != PREFERENCES_KIND:
        raise PosttrainError(
            f"dpo --pairs {source}: {manifest.ref} is a {manifest.kind!r} artifact, not preferences"
        )
    path = registry.fetch(manifest.ref) / PREFERENCES_FILE
    if not path.is_file():
        raise PosttrainError(f"dpo --pairs {source}: {manifest.ref} has no {PREFERENCES_FILE}")
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            pairs.append(PreferencePair.model_validate_json(line))
        except ValidationError as exc:
            raise PosttrainError(
                f"{manifest.ref}/{PREFERENCES_FILE} line {number}: not a preference pair: {exc}"
            ) from exc
    if not pairs:
        raise PosttrainError(f"dpo --pairs {source}: {manifest.ref} holds no pairs")
    log.info("event=dpo_review_pairs ref=%s pairs=%d", manifest.ref, len(pairs))
    return manifest.ref, pairs


def _training_row(prompt: Any, chosen: Any, rejected: Any, source: str) -> dict[str, Any]:
    """One dataset row; every source yields the same columns, so rows of several sources make one dataset."""
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "source": source}


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
    """DPO from ``config.base`` on the pairs of ``config.pairs`` (verifier-labelled rollouts and/or human review
    preferences); publish the candidate with lineage and trace."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    context = StageContext(config, "dpo", instances)
    rows: list[dict[str, Any]] = []
    sources: dict[str, int] = {}
    # Review artifacts first: an unknown session fails before any sampling.
    for source in (s for s in config.pairs if s.startswith(REVIEWS_SOURCE)):
        ref, reviewed = review_pairs(context.registry, source)
        sources[ref] = len(reviewed)
        rows += [
            _training_row(
                **p.model_dump(include={"prompt", "chosen", "rejected"}), source=f"{ref}:{p.pair_id}"
            )
            for p in reviewed
        ]
    tokenizer = context.load_tokenizer()
    base = context.load_model()
    before = context.held_out(base, tokenizer) if config.evaluate_before_after else None
    if "verifier" in config.pairs:
        labelled = preference_pairs(context, config, base, tokenizer)
        sources["verifier"] = len(labelled)
        rows += [_training_row(p["prompt"], p["chosen"], p["rejected"], f"verifier:{p['instance_id']}")
                 for p in labelled]  # fmt: skip
    if not rows:
        raise PosttrainError(
            "dpo: no prompt produced both a verified-correct and a verified-wrong completion"
        )
    dataset = Dataset.from_list(rows)

    def make_trainer(callbacks: list[Any], replay: int) -> Any:
        args = DPOConfig(**context.trainer_args(replay), beta=config.beta, max_length=config.train.max_length)
        return context.trl_trainer(DPOTrainer, args, tokenizer, callbacks, train_dataset=dataset)

    trainer, guarded = context.train(make_trainer, resume)
    after = context.held_out(trainer.model, tokenizer) if config.evaluate_before_after else None
    metrics = {
        "steps": guarded.steps,
        "rollbacks": guarded.rollbacks,
        "pairs": len(rows),
        "pair_sources": sources,
        "rollouts_traced": context.trace.count,
        **before_after(before, after),
    }
    return context.finish(trainer, tokenizer, guarded.history, metrics)
