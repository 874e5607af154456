"""Verifiers for every task family: plain functions, importable without starting anything heavy.

Stable API (post-training imports these as RL rewards; arguments are only ever added with defaults):

- ``verify(instance, output) -> VerifierResult`` dispatches on ``instance.family``:
  ``documents`` takes the completion text, ``agent`` an :class:`AgentTrace` (or a list of
  :class:`ToolCallRecord`, replayed on the simulated shop), ``terminal`` a :class:`TerminalObservation`.
- ``await verify_terminal_in_sandbox(instance, sandbox)`` runs a terminal instance's checks inside any
  Inspect-style sandbox (``exec`` / ``write_file``), hidden tests included, then calls ``verify``.
- ``replay_agent(instance, calls) -> AgentTrace`` executes tool calls on a fresh shop for offline scoring.

Every result has ``score`` in [0, 1], ``correct``, per-component scores and a one-line explanation.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from evalsuite.errors import EvalError
from evalsuite.schema import TaskInstance, VerifierResult
from evalsuite.shop import FORBIDDEN_TOOLS, LOOKUP_TOOLS, Shop, ShopRejected, ShopState

if TYPE_CHECKING:
    from inspect_ai.util import ExecResult

__all__ = [
    "AGENT_WEIGHTS",
    "UNFORMATTED_ANSWER_SCORE",
    "AgentTrace",
    "CheckOutcome",
    "TaskInstance",
    "TerminalObservation",
    "ToolCallRecord",
    "VerifierResult",
    "normalize_text",
    "parse_answer",
    "parse_number",
    "replay_agent",
    "run_terminal_checks",
    "verify",
    "verify_agent",
    "verify_documents",
    "verify_terminal",
    "verify_terminal_in_sandbox",
]


# ---------------------------------------------------------------- documents
_ANSWER = re.compile(r"ANSWER\s*[:=]\s*(.+)", re.IGNORECASE)
_MINUS = "\u2212"
_NUMBER = re.compile(r"[-\u2212]?\s?\d[\d,']*(?:\.\d+)?")


def parse_answer(completion: str) -> str | None:
    """The text after the last ``ANSWER:`` marker, or None when the completion has none (malformed)."""
    matches = _ANSWER.findall(completion or "")
    if not matches:
        return None
    answer = str(matches[-1]).strip().strip("*`").strip()
    return answer or None


def normalize_text(value: str) -> str:
    """Case-fold, collapse whitespace, drop surrounding quotes/markup and a trailing full stop."""
    return " ".join(value.split()).strip(" \"'`*.").casefold()


def parse_number(value: str) -> float | None:
    """First number in ``value``, ignoring currency words, thousands separators and a unicode minus."""
    for symbol in ("EUR", "USD", "\u20ac", "$", "\u00a3"):
        value = value.replace(symbol, "")
    match = _NUMBER.search(value)
    if match is None:
        return None
    cleaned = match.group(0).replace(_MINUS, "-").replace(",", "").replace("'", "").replace(" ", "")
    try:
        number = float(cleaned)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


# Reward for a right answer given without the ``ANSWER:`` line (read leniently from the last line).
UNFORMATTED_ANSWER_SCORE = 0.75
_FALLBACK_MAX_CHARS = 300


def _last_line(completion: str) -> str | None:
    lines = [line.strip() for line in (completion or "").splitlines() if line.strip()]
    return lines[-1] if lines and len(lines[-1]) <= _FALLBACK_MAX_CHARS else None


def _last_number(text: str) -> float | None:
    for symbol in ("EUR", "USD", "\u20ac", "$", "\u00a3"):
        text = text.replace(symbol, "")
    for match in reversed(list(_NUMBER.finditer(text))):
        number = parse_number(match.group(0))
        if number is not None:
            return number
    return None


def verify_documents(instance: TaskInstance, completion: str) -> VerifierResult:
    """Exact (normalised) or numeric (absolute tolerance) match of the answer.

    The answer is the ``ANSWER:`` line (score 1.0 when right). Without one, the last line of the completion
    (at most 300 characters) is read leniently: its last number for numeric questions, or containment of
    the expected text for exact ones; a right answer found that way scores ``UNFORMATTED_ANSWER_SCORE``.
    ``correct`` means the answer is right either way; ``components["format"]`` says which way was used.
    """
    expected = instance.expected["answer"]
    numeric = instance.expected.get("match") == "numeric"
    tolerance = float(instance.expected.get("tolerance", 0.01))
    answer = parse_answer(completion)
    formatted = answer is not None
    if answer is None:
        answer = _last_line(completion)
    if answer is None:
        return VerifierResult(score=0.0, correct=False, components={"format": 0.0, "match": 0.0},
                              explanation="no 'ANSWER:' line and no short final line to read")  # fmt: skip
    if numeric:
        number = parse_number(answer) if formatted else _last_number(answer)
        ok = number is not None and abs(number - float(expected)) <= tolerance
        explanation = f"answer {number} vs expected {expected} (tolerance {tolerance})"
    elif formatted:
        ok = normalize_text(answer) == normalize_text(str(expected))
        explanation = f"answer {answer!r} vs expected {expected!r}"
    else:
        ok = normalize_text(str(expected)) in normalize_text(answer)
        explanation = f"final line {answer!r} vs expected {expected!r}"
    if not formatted:
        explanation += " (no ANSWER: line; read from the last line)"
    score = (1.0 if formatted else UNFORMATTED_ANSWER_SCORE) if ok else 0.0
    return VerifierResult(score=score, correct=ok, components={"format": float(formatted), "match": float(ok)},
                          explanation=explanation)  # fmt: skip


# ---------------------------------------------------------------- agent
AGENT_WEIGHTS: dict[str, float] = {"goal": 0.7, "protocol": 0.15, "budget": 0.15}


class ToolCallRecord(BaseModel):
    """One tool call the model made; ``error`` is set when the environment rejected it."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class AgentTrace(BaseModel):
    """What an agent episode left behind: the shop's final state and the calls, in order."""

    final_state: dict[str, Any]
    calls: list[ToolCallRecord] = Field(default_factory=list)


def replay_agent(instance: TaskInstance, calls: list[ToolCallRecord] | list[dict[str, Any]]) -> AgentTrace:
    """Execute ``calls`` on a fresh shop built from the instance; rejected calls get their error recorded."""
    shop = Shop(ShopState.model_validate(instance.expected["initial_state"]))
    records: list[ToolCallRecord] = []
    for call in calls:
        record = call if isinstance(call, ToolCallRecord) else ToolCallRecord.model_validate(call)
        error = None
        try:
            shop.call(record.name, record.arguments)
        except ShopRejected as exc:
            error = str(exc)
        records.append(record.model_copy(update={"error": error}))
    return AgentTrace(final_state=shop.state.model_dump(), calls=records)


def verify_agent(instance: TaskInstance, trace: AgentTrace) -> VerifierResult:
    """Goal state reached (whole shop state equal), protocol kept, steps within budget.

    ``score = 0.7 goal + 0.15 protocol + 0.15 budget``, forced to 0 when a forbidden tool was called;
    protocol loses 0.25 per rejected call. ``correct`` needs the goal, no violation and the budget kept.
    When the request needs no change (the goal is the initial state, e.g. "cancel it if still pending" for
    a shipped order), the goal counts only if the model looked something up successfully: otherwise an
    episode that never called a tool would earn full credit on every such instance.
    """
    goal = ShopState.model_validate(instance.expected["goal_state"])
    reached = ShopState.model_validate(trace.final_state) == goal
    no_change = goal == ShopState.model_validate(instance.expected["initial_state"])
    looked_up = any(c.name in LOOKUP_TOOLS and c.error is None for c in trace.calls)
    unchecked = reached and no_change and not looked_up
    reached = reached and not unchecked
    forbidden = [c.name for c in trace.calls if c.name in FORBIDDEN_TOOLS]
    invalid = sum(1 for c in trace.calls if c.error is not None)
    protocol = 0.0 if forbidden else max(0.0, 1.0 - 0.25 * invalid)
    within = len(trace.calls) <= instance.max_steps
    components = {"goal": float(reached), "protocol": protocol, "budget": float(within)}
    score = 0.0 if forbidden else sum(AGENT_WEIGHTS[k] * v for k, v in components.items())
    explanation = (
        f"goal {'reached' if reached else 'not reached'}"
        f"{' (nothing to change, but nothing was looked up)' if unchecked else ''}; {len(trace.calls)} calls (budget {instance.max_steps}); "
        f"{invalid} rejected; forbidden: {', '.join(forbidden) or 'none'}"
    )
    correct = reached and not forbidden and within
    return VerifierResult(
        score=round(score, 6), correct=correct, components=components, explanation=explanation
    )


# ---------------------------------------------------------------- terminal
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


# ---------------------------------------------------------------- dispatch
def verify(instance: TaskInstance, output: Any) -> VerifierResult:
    """Score ``output`` for ``instance`` with its family's verifier (see the module docstring)."""
    if instance.family == "documents":
        if not isinstance(output, str):
            raise EvalError("documents verification takes the completion text")
        return verify_documents(instance, output)
    if instance.family == "agent":
        if isinstance(output, list):
            output = replay_agent(instance, output)
        if not isinstance(output, AgentTrace):
            raise EvalError("agent verification takes an AgentTrace or a list of tool calls")
        return verify_agent(instance, output)
    if instance.family == "terminal":
        if not isinstance(output, TerminalObservation):
            raise EvalError(
                "terminal verification takes a TerminalObservation (see verify_terminal_in_sandbox)"
            )
        return verify_terminal(instance, output)
    raise EvalError(f"unknown family {instance.family!r}")
