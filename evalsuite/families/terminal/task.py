"""The terminal family's Inspect task: shell work in the bwrap sandbox, scored by checks run in it."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver, system_message
from inspect_ai.tool import bash
from inspect_ai.util import SandboxEnvironmentSpec, sandbox

from evalsuite.families.terminal.prompt import TERMINAL_SYSTEM
from evalsuite.families.terminal.verifier import verify_terminal_in_sandbox
from evalsuite.generators import DEFAULT_ROTATION_KEY
from evalsuite.inspect_task import correct_rate, family_dataset, instance_of, to_score, tool_turns
from evalsuite.sandbox import BwrapConfig
from evalsuite.schema import Difficulty, Split


@solver
def prepare_workspace() -> Solver:
    """Write the instance's visible files into the sandbox and give the model the bash tool."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        for path, contents in instance_of(state).files.items():
            await sandbox().write_file(path, contents)
        state.tools = [bash(timeout=30)]
        return state

    return solve


@scorer(metrics=[mean(), stderr(), correct_rate()])
def terminal_scorer() -> Scorer:
    """Run the instance's checks (hidden tests included) inside the sample's sandbox."""

    async def score(state: TaskState, target: Target) -> Score:
        return to_score(await verify_terminal_in_sandbox(instance_of(state), sandbox()))

    return score


@task
def terminal(
    split: Split = "test",
    n: int = 20,
    seed: int = 0,
    difficulty: Difficulty | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
    sandbox_config: str | None = None,
) -> Task:
    """Shell tasks in the bwrap sandbox; ``sandbox_config`` is an optional BwrapConfig YAML file."""
    return Task(
        dataset=family_dataset("terminal", split, n, seed, difficulty, rotation_key),
        solver=[system_message(TERMINAL_SYSTEM), prepare_workspace(), tool_turns()],
        scorer=terminal_scorer(),
        sandbox=SandboxEnvironmentSpec("bwrap", sandbox_config or BwrapConfig()),
    )
