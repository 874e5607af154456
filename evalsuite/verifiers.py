"""``verify(instance, output)``: score one output with the verifier its family registered.

Stable API (post-training uses the verifiers as RL rewards; arguments are only ever added with defaults).
What ``output`` is depends on the family: ``documents`` takes the completion text, ``agent`` an
``AgentTrace`` or a list of tool calls (replayed on the simulated shop), ``terminal`` a
``TerminalObservation`` (see ``verify_terminal_in_sandbox``). Each family's own functions live in
``evalsuite/families/<name>/verifier.py``. Every result has ``score`` in [0, 1], ``correct``, per-component
scores and a one-line explanation. Importing this module starts nothing heavy (no Inspect, no torch).
"""

from __future__ import annotations

from typing import Any

from evalsuite.registry import get_family
from evalsuite.schema import TaskInstance, VerifierResult


def verify(instance: TaskInstance, output: Any) -> VerifierResult:
    """Score ``output`` for ``instance`` with its family's verifier; a wrong kind of output is an EvalError."""
    return get_family(instance.family).verify(instance, output)
