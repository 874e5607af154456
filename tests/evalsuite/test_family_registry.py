"""A fourth eval family from a third-party package reaches ``tandem eval``, the gate and post-training's task
pool through the ``tandem.families`` entry point alone: no file of Tandem's is edited for it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from evalsuite import registry
from evalsuite.errors import EvalError, GeneratorError

# The third-party package: one folder with the same four modules as a built-in family.
RIDDLES = {
    "__init__.py": """
        from typing import Any

        from evalsuite.errors import EvalError
        from evalsuite.registry import eval_family
        from evalsuite.schema import TaskInstance, VerifierResult
        from tandem_riddles.generator import BUILDERS, reference_answer
        from tandem_riddles.prompt import SYSTEM


        @eval_family("riddles", builders=BUILDERS, task="tandem_riddles.task:riddles", system_prompt=SYSTEM,
                     reference_answer=reference_answer)
        def verify(instance: TaskInstance, output: Any) -> VerifierResult:
            if not isinstance(output, str):
                raise EvalError("riddles verification takes the completion text")
            correct = output.strip().endswith(instance.expected["answer"])
            return VerifierResult(score=float(correct), correct=correct)
    """,
    "generator.py": """
        import random

        from evalsuite.generators.base import Draft
        from evalsuite.schema import Difficulty, TaskInstance

        def add(rng: random.Random, difficulty: Difficulty) -> Draft:
            a, b = rng.randrange(1000), rng.randrange(1000)
            return Draft(task_type="add", prompt=f"What is {a} plus {b}?", expected={"answer": str(a + b)})

        BUILDERS = {"add": add}

        def reference_answer(instance: TaskInstance) -> str:
            return f"It is {instance.expected['answer']}"
    """,
    "prompt.py": """
        SYSTEM = "Answer the riddle; end with the number."
    """,
    "task.py": """
        from inspect_ai import Task, task
        from inspect_ai.scorer import Score, Scorer, Target, mean, scorer
        from inspect_ai.solver import TaskState, generate, system_message

        from evalsuite.inspect_task import correct_rate, family_dataset, instance_of, to_score
        from evalsuite.verifiers import verify
        from tandem_riddles.prompt import SYSTEM

        @scorer(metrics=[mean(), correct_rate()])
        def riddles_scorer() -> Scorer:
            async def score(state: TaskState, target: Target) -> Score:
                return to_score(verify(instance_of(state), state.output.completion))
            return score

        @task
        def riddles(split="test", n=20, seed=0, difficulty=None, rotation_key="r0") -> Task:
            return Task(dataset=family_dataset("riddles", split, n, seed, difficulty, rotation_key),
                        solver=[system_message(SYSTEM), generate()], scorer=riddles_scorer())
    """,
}


@pytest.fixture()
def install_riddles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Write the package and its distribution metadata; calling the result puts them on sys.path.

    The registry is snapshotted first and restored afterwards, so no other test sees the fourth family.
    """
    package = tmp_path / "tandem_riddles"
    package.mkdir()
    for name, source in RIDDLES.items():
        (package / name).write_text(textwrap.dedent(source))
    dist_info = tmp_path / "tandem_riddles-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tandem-riddles\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[tandem.families]\nriddles = tandem_riddles\n")
    registry.family_names()  # built-ins registered before the snapshot
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))

    def install() -> None:
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(registry, "_discovered", False)  # the next lookup scans entry points again

    yield install
    for name in [m for m in sys.modules if m == "tandem_riddles" or m.startswith("tandem_riddles.")]:
        del sys.modules[name]


def test_a_fourth_family_appears_in_eval_gate_and_posttrain_pool(
    install_riddles: Callable[[], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inspect_ai.model import ChatMessageUser, ModelOutput, ModelUsage, get_model
    from typer.testing import CliRunner

    import evalsuite.runner
    from cli.main import app
    from evalsuite.gate import FamilyPolicy, GatePolicy, evaluate_gate, read_outcomes
    from evalsuite.generators import generate_instances
    from posttrain import TaskPool, TaskPoolConfig, format_for

    # Before the package is installed, nothing knows the family.
    with pytest.raises(GeneratorError):
        registry.get_family("riddles")
    with pytest.raises(ValidationError, match="riddles"):
        TaskPoolConfig(families=["riddles"])
    assert "riddles" not in GatePolicy().families

    install_riddles()
    assert registry.family_names() == ("agent", "documents", "long_context", "riddles", "terminal")

    # tandem eval: the unknown-family error lists it among the choices, and it runs end to end.
    runner = CliRunner()
    refused = runner.invoke(app, ["eval", "--model", "tandem-fast", "--families", "poetry"])
    assert isinstance(refused.exception, EvalError) and "riddles" in str(refused.exception)
    instances = {i.prompt: i for i in generate_instances("riddles", "dev", 4, seed=2)}

    def answer(messages: list, *_: object) -> ModelOutput:  # type: ignore[type-arg]
        prompt = next(m.text for m in messages if isinstance(m, ChatMessageUser))
        output = ModelOutput.from_content("mockllm", f"Let me add. {instances[prompt].expected['answer']}")
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    monkeypatch.setattr(
        evalsuite.runner, "resolve_model", lambda *_, **__: get_model("mockllm/m", custom_outputs=answer)
    )
    args = ["eval", "--model", "tandem-fast", "--families", "riddles", "--split", "dev", "--limit", "4",
            "--seed", "2", "--log-dir", str(tmp_path / "logs")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    outcomes = read_outcomes(tmp_path / "logs")
    assert {o.sample_id for o in outcomes} == {i.instance_id for i in instances.values()}
    assert all(o.family == "riddles" and o.correct for o in outcomes)

    # The gate: the default policy covers it, and it is judged like any built-in family.
    assert set(GatePolicy().families) == {"agent", "documents", "long_context", "riddles", "terminal"}
    verdict = evaluate_gate(outcomes, outcomes, GatePolicy(parity={"required": False}))
    (check,) = [c for c in verdict.checks if c.family == "riddles"]
    assert check.kind == "coverage" and "4 paired samples" in check.reason
    policy = GatePolicy(families={"riddles": FamilyPolicy(min_samples=4)}, parity={"required": False})
    (check,) = evaluate_gate(outcomes, outcomes, policy).checks[:1]
    assert check.family == "riddles" and check.kind == "non_inferiority" and check.passed

    # Post-training: the pool draws it, trains it single-turn on its own prompt, demonstrations verify.
    pool = TaskPool(TaskPoolConfig(families=["riddles"], instances_per_family=6))
    assert len(pool.by_family["riddles"]) == 6
    rollout = format_for("riddles")
    for instance_id in pool.balanced(6):
        instance = pool.instance(instance_id)
        assert instance.family == "riddles" and instance.split == "train"
        assert rollout.messages(instance)[0] == {
            "role": "system",
            "content": "Answer the riddle; end with the number.",
        }
        assert rollout.score(instance, rollout.demonstration(instance))[0].correct
        assert not rollout.score(instance, "no idea")[0].correct
