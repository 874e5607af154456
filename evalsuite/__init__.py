"""Tandem's eval suite: a registry of eval families (built in: terminal, documents, agent, long_context; one folder each
under ``evalsuite/families``, and the replay family traffic, which replays private eval sets built from captured
gateway traffic), seeded generators with disjoint splits, verifiers usable as RL rewards, the ``bwrap`` sandbox
provider and the paired release gate.

This ``__init__`` stays light (no Inspect import): the registry, generators and verifiers are plain Python.
Inspect-facing pieces live in each family's ``task`` module, ``evalsuite.sandbox``, ``evalsuite.runner``.
"""

from evalsuite.errors import EvalError, GateError, GeneratorError, SandboxError
from evalsuite.generators import DEFAULT_ROTATION_KEY, generate_instance, generate_instances, task_types
from evalsuite.registry import (
    ENTRY_POINT_GROUP,
    EvalFamily,
    ReplayFamily,
    eval_family,
    families,
    family_names,
    get_family,
    get_replay_family,
    replay_family,
    replay_family_names,
)
from evalsuite.schema import (
    DIFFICULTIES,
    SPLITS,
    Difficulty,
    Family,
    Split,
    TaskInstance,
    TerminalCheck,
    VerifierResult,
)
from evalsuite.verifiers import verify

__all__ = [
    "DEFAULT_ROTATION_KEY",
    "DIFFICULTIES",
    "ENTRY_POINT_GROUP",
    "SPLITS",
    "Difficulty",
    "EvalError",
    "EvalFamily",
    "Family",
    "GateError",
    "GeneratorError",
    "ReplayFamily",
    "SandboxError",
    "Split",
    "TaskInstance",
    "TerminalCheck",
    "VerifierResult",
    "eval_family",
    "families",
    "family_names",
    "generate_instance",
    "generate_instances",
    "get_family",
    "get_replay_family",
    "replay_family",
    "replay_family_names",
    "task_types",
    "verify",
]
