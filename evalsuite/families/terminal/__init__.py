"""Terminal: inspect and transform files, or fix a bug, in a sandboxed shell; scored by checks run there."""

from __future__ import annotations

from typing import Any

from evalsuite.errors import EvalError
from evalsuite.families.terminal.generator import BUILDERS
from evalsuite.families.terminal.prompt import TERMINAL_SYSTEM
from evalsuite.families.terminal.verifier import TerminalObservation, verify_terminal
from evalsuite.registry import eval_family
from evalsuite.schema import TaskInstance, VerifierResult


@eval_family(
    "terminal",
    builders=BUILDERS,
    task="evalsuite.families.terminal.task:terminal",
    system_prompt=TERMINAL_SYSTEM,
)
def verify(instance: TaskInstance, output: Any) -> VerifierResult:
    """Takes a :class:`TerminalObservation` (see ``verify_terminal_in_sandbox``)."""
    if not isinstance(output, TerminalObservation):
        raise EvalError("terminal verification takes a TerminalObservation (see verify_terminal_in_sandbox)")
    return verify_terminal(instance, output)
