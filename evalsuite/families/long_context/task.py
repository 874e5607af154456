"""The long-context family's Inspect task: one answer per haystack, scored by its ``ANSWER:`` line."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import TaskState, generate, system_message
from pydantic import ValidationError

from evalsuite.errors import EvalError
from evalsuite.families.long_context.haystack import LongContextConfig, use_config
from evalsuite.families.long_context.prompt import LONG_CONTEXT_SYSTEM
from evalsuite.families.long_context.verifier import verify_long_context
from evalsuite.generators import DEFAULT_ROTATION_KEY
from evalsuite.inspect_task import correct_rate, family_dataset, instance_of, to_score
from evalsuite.schema import Difficulty, Split


@scorer(metrics=[mean(), stderr(), correct_rate()])
def long_context_scorer() -> Scorer:
    """Numeric, name or table-cell match of the completion's ``ANSWER:`` line against the needle."""

    async def score(state: TaskState, target: Target) -> Score:
        completion = state.output.completion if state.output else ""
        return to_score(verify_long_context(instance_of(state), completion), answer=completion[-200:])

    return score


@task
def long_context(
    split: Split = "test",
    n: int = 20,
    seed: int = 0,
    difficulty: Difficulty | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
    max_length: int | str | None = None,
    tokenizer: str | None = None,
) -> Task:
    """Needle-in-a-haystack recall from 1k tokens up to ``max_length`` (default: the environment's or 8192)
    at depths 0-100 %, counting tokens with ``tokenizer`` (default: the bundled model's). ``tandem eval``
    against the gateway sets ``max_length`` to the window the gateway serves the model with."""
    config = LongContextConfig.from_env()
    # `tandem eval -O long_context.max_length=16384` passes a string; pydantic converts it or names it.
    overrides = {"max_length": max_length, "tokenizer": tokenizer}
    try:
        config = LongContextConfig.model_validate(
            {**config.model_dump(), **{k: v for k, v in overrides.items() if v is not None}}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise EvalError(f"long_context.{where}={first.get('input')!r}: {first['msg']}") from None
    with use_config(config):
        dataset = family_dataset("long_context", split, n, seed, difficulty, rotation_key)
    return Task(
        dataset=dataset,
        solver=[system_message(LONG_CONTEXT_SYSTEM), generate()],
        scorer=long_context_scorer(),
    )
