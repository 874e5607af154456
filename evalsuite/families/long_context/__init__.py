"""Long context: needle-in-a-haystack recall by length and depth, answered on an ``ANSWER:`` line."""

from __future__ import annotations

from typing import Any

from evalsuite.errors import EvalError
from evalsuite.families.long_context.generator import BUILDERS, reference_answer
from evalsuite.families.long_context.haystack import LongContextConfig, use_config
from evalsuite.families.long_context.prompt import LONG_CONTEXT_SYSTEM
from evalsuite.families.long_context.report import NeedleOutcome, recall_grid, recall_heatmap
from evalsuite.families.long_context.verifier import verify_long_context
from evalsuite.registry import eval_family
from evalsuite.schema import TaskInstance, VerifierResult

__all__ = [
    "LongContextConfig",
    "NeedleOutcome",
    "recall_grid",
    "recall_heatmap",
    "use_config",
    "verify",
]


@eval_family(
    "long_context",
    builders=BUILDERS,
    task="evalsuite.families.long_context.task:long_context",
    system_prompt=LONG_CONTEXT_SYSTEM,
    reference_answer=reference_answer,
    report="evalsuite.families.long_context.report:write_report",
)
def verify(instance: TaskInstance, output: Any) -> VerifierResult:
    """Takes the completion text."""
    if not isinstance(output, str):
        raise EvalError("long_context verification takes the completion text")
    return verify_long_context(instance, output)
