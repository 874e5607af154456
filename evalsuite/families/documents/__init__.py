"""Documents: questions over generated invoices, statements and contracts, answered on an ``ANSWER:`` line."""

from __future__ import annotations

from typing import Any

from evalsuite.errors import EvalError
from evalsuite.families.documents.generator import BUILDERS, reference_answer
from evalsuite.families.documents.prompt import DOCUMENTS_SYSTEM
from evalsuite.families.documents.verifier import verify_documents
from evalsuite.registry import eval_family
from evalsuite.schema import TaskInstance, VerifierResult


@eval_family(
    "documents",
    builders=BUILDERS,
    task="evalsuite.families.documents.task:documents",
    system_prompt=DOCUMENTS_SYSTEM,
    reference_answer=reference_answer,
)
def verify(instance: TaskInstance, output: Any) -> VerifierResult:
    """Takes the completion text."""
    if not isinstance(output, str):
        raise EvalError("documents verification takes the completion text")
    return verify_documents(instance, output)
