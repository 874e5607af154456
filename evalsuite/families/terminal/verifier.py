"""Terminal verifier: the instance's checks (hidden tests included) run in the sandbox the model worked in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, Field

from evalsuite.errors import EvalError
from evalsuite.schema import TaskInstance, VerifierResult

if TYPE_CHECKING:
    from inspect_ai.util import ExecResult


class CheckOutcome(BaseModel):
    exit_code: int
    stdout: str = ""


class TerminalObservation(BaseModel):
    """Outcome of each of the instance's checks, keyed by check name (missing = not run = failed)."""

    checks: dict[str, CheckOutcome] = Field(default_factory=dict)


class SandboxLike(Protocol):
    async def exec(self, cmd: list[str], *, timeout: int | None = None) -> ExecResult[str]: ...

    async def write_file(self, file: str, contents: str | bytes) -> None: ...


def verify_terminal(instance: TaskInstance, observation: TerminalObservation) -> VerifierResult:
    """Weighted fraction of checks passed; correct only when every check passes."""
    if not instance.checks:
        raise EvalError(f"terminal instance {instance.instance_id} has no checks")
    total = sum(c.weight for c in instance.checks)
    components: dict[str, float] = {}
    failures = []
    for check in instance.checks:
        outcome = observation.checks.get(check.name)
        passed = (
            outcome is not None
            and outcome.exit_code == 0
            and (check.expected_stdout is None or outcome.stdout.strip() == check.expected_stdout.strip())
        )
        components[check.name] = 1.0 if passed else 0.0
        if not passed:
            failures.append(check.name if outcome is None else f"{check.name} (exit {outcome.exit_code})")
    score = sum(c.weight * components[c.name] for c in instance.checks) / total
    explanation = "all checks passed" if not failures else "failed: " + ", ".join(failures)
    return VerifierResult(
        score=round(score, 6), correct=not failures, components=components, explanation=explanation
    )


async def run_terminal_checks(
    instance: TaskInstance, sandbox: SandboxLike, timeout: int = 20
) -> TerminalObservation:
    """Write the hidden files, then run every check in ``sandbox`` (a timeout counts as a failure)."""
    for path, contents in instance.hidden_files.items():
        await sandbox.write_file(path, contents)
    outcomes: dict[str, CheckOutcome] = {}
    for check in instance.checks:
        try:
            result = await sandbox.exec(["bash", "-c", check.command], timeout=timeout)
        except TimeoutError:
            outcomes[check.name] = CheckOutcome(exit_code=124, stdout="")
            continue
        outcomes[check.name] = CheckOutcome(exit_code=result.returncode, stdout=result.stdout)
    return TerminalObservation(checks=outcomes)


async def verify_terminal_in_sandbox(instance: TaskInstance, sandbox: SandboxLike) -> VerifierResult:
    """Run the checks in the sandbox the model worked in and score them."""
    return verify_terminal(instance, await run_terminal_checks(instance, sandbox))
