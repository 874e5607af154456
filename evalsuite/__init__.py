"""Tandem's eval suite: Inspect tasks (terminal, documents, agent), seeded generators with disjoint splits,
verifiers usable as RL rewards, the ``bwrap`` sandbox provider and the paired release gate.

This ``__init__`` stays light (no Inspect import): the generators and verifiers are plain Python.
Inspect-facing pieces live in ``evalsuite.tasks``, ``evalsuite.sandbox``, ``evalsuite.runner``.
"""

from evalsuite.errors import EvalError, GateError, GeneratorError, SandboxError
from evalsuite.generators import DEFAULT_ROTATION_KEY, generate_instance, generate_instances, task_types
from evalsuite.schema import (
    DIFFICULTIES,
    FAMILIES,
    SPLITS,
    Difficulty,
    Family,
    Split,
    TaskInstance,
    TerminalCheck,
    VerifierResult,
)
from evalsuite.verifiers import AgentTrace, TerminalObservation, ToolCallRecord, verify

__all__ = [
    "DEFAULT_ROTATION_KEY",
    "DIFFICULTIES",
    "FAMILIES",
    "SPLITS",
    "AgentTrace",
    "Difficulty",
    "EvalError",
    "Family",
    "GateError",
    "GeneratorError",
    "SandboxError",
    "Split",
    "TaskInstance",
    "TerminalCheck",
    "TerminalObservation",
    "ToolCallRecord",
    "VerifierResult",
    "generate_instance",
    "generate_instances",
    "task_types",
    "verify",
]
