"""What every family's Inspect task shares: samples built from task instances, scores from verdicts, the
``correct_rate`` metric and the tool-turn solver.

Each sample carries its :class:`TaskInstance` in ``metadata["instance"]``; the sample id is the instance id,
so logs of two models on the same split pair up sample by sample in the release gate.
"""

from __future__ import annotations

import json

from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import Metric, SampleScore, Score, metric
from inspect_ai.solver import Generate, Solver, TaskState, solver

from evalsuite.generators import generate_instances
from evalsuite.schema import Difficulty, Split, TaskInstance, VerifierResult

# Turns allowed beyond an instance's step budget, so that overrunning it is observed rather than cut off.
_TURN_SLACK = 2


def instance_of(state: TaskState) -> TaskInstance:
    """The task instance a sample was built from."""
    return TaskInstance.model_validate(state.metadata["instance"])


def to_sample(instance: TaskInstance) -> Sample:
    """A sample whose id is the instance id, so two models' logs of one split pair up in the gate."""
    return Sample(
        id=instance.instance_id,
        input=instance.prompt,
        target=json.dumps(instance.expected.get("answer", ""), default=str),
        metadata={
            "instance": instance.model_dump(mode="json"),
            "family": instance.family,
            "task_type": instance.task_type,
            "difficulty": instance.difficulty,
        },
    )


def family_dataset(
    family: str, split: Split, n: int, seed: int, difficulty: Difficulty | None, rotation_key: str
) -> MemoryDataset:
    """``n`` generated instances of ``family`` in ``split`` as an Inspect dataset, one sample each."""
    instances = generate_instances(
        family, split, n, seed=seed, difficulty=difficulty, rotation_key=rotation_key
    )
    return MemoryDataset([to_sample(i) for i in instances], name=f"{family}-{split}")


@metric
def correct_rate() -> Metric:
    """Fraction of samples whose verifier said ``correct`` (the gate's binary outcome)."""

    def compute(scores: list[SampleScore]) -> float:
        flags = [bool((s.score.metadata or {}).get("correct")) for s in scores]
        return sum(flags) / len(flags) if flags else 0.0

    return compute


def to_score(result: VerifierResult, answer: str | None = None) -> Score:
    """A verifier's verdict as an Inspect score (``correct`` kept in metadata for the gate)."""
    return Score(
        value=result.score,
        answer=answer,
        explanation=result.explanation,
        metadata={"correct": result.correct, "components": result.components},
    )


@solver
def tool_turns() -> Solver:
    """Let the model call tools turn by turn, up to the instance's step budget plus a little slack."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        for _ in range(instance_of(state).max_steps + _TURN_SLACK):
            state = await generate(state, tool_calls="single")
            if state.completed or not state.output.message.tool_calls:
                break
        return state

    return solve
