"""The documents family's Inspect task: one answer per question, scored by its ``ANSWER:`` line."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import TaskState, system_message

from evalsuite.families.documents.prompt import DOCUMENTS_SYSTEM
from evalsuite.families.documents.verifier import verify_documents
from evalsuite.generators import DEFAULT_ROTATION_KEY
from evalsuite.inspect_task import correct_rate, family_dataset, instance_of, to_score
from evalsuite.schema import Difficulty, Split


@scorer(metrics=[mean(), stderr(), correct_rate()])
def documents_scorer() -> Scorer:
    """Exact / numeric match of the completion's ``ANSWER:`` line."""

    async def score(state: TaskState, target: Target) -> Score:
        completion = state.output.completion if state.output else ""
        return to_score(verify_documents(instance_of(state), completion), answer=completion[-200:])

    return score


@task
def documents(
    split: Split = "test",
    n: int = 20,
    seed: int = 0,
    difficulty: Difficulty | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
) -> Task:
    """Field extraction, totals, cross-checks and needle-at-depth questions over generated documents."""
    from inspect_ai.solver import generate

    return Task(
        dataset=family_dataset("documents", split, n, seed, difficulty, rotation_key),
        solver=[system_message(DOCUMENTS_SYSTEM), generate()],
        scorer=documents_scorer(),
    )
