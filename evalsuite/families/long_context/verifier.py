"""Long-context verifier: the completion's ``ANSWER:`` line against the needle.

Numbers match numerically, names by case-insensitive containment of the full name, table cells exactly
(normalised). Answer parsing is the documents family's, so both families read answers the same way.
"""

from __future__ import annotations

from evalsuite.families.documents.verifier import (
    UNFORMATTED_ANSWER_SCORE,
    normalize_text,
    parse_answer,
    parse_number,
)
from evalsuite.schema import TaskInstance, VerifierResult

_FALLBACK_MAX_CHARS = 300


def _last_line(completion: str) -> str | None:
    lines = [line.strip() for line in (completion or "").splitlines() if line.strip()]
    return lines[-1] if lines and len(lines[-1]) <= _FALLBACK_MAX_CHARS else None


def _matches(match: str, expected: str, answer: str, formatted: bool) -> bool:
    if match == "numeric":
        if formatted:
            number = parse_number(answer)
            return number is not None and number == float(expected)
        # unformatted: any number on the final line may be the answer, so the expected one must appear
        return any(parse_number(token) == float(expected) for token in answer.replace(",", " ").split())
    if match == "name" or not formatted:
        return normalize_text(expected) in normalize_text(answer)
    return normalize_text(answer) == normalize_text(expected)


def verify_long_context(instance: TaskInstance, completion: str) -> VerifierResult:
    """Score a completion: 1.0 for the right ``ANSWER:`` line, ``UNFORMATTED_ANSWER_SCORE`` when the right
    value is only on a short final line, else 0. ``components["format"]`` says which way was read."""
    expected = str(instance.expected["answer"])
    match = str(instance.expected.get("match", "exact"))
    answer = parse_answer(completion)
    formatted = answer is not None
    if answer is None:
        answer = _last_line(completion)
    if answer is None:
        return VerifierResult(score=0.0, correct=False, components={"format": 0.0, "match": 0.0},
                              explanation="no 'ANSWER:' line and no short final line to read")  # fmt: skip
    ok = _matches(match, expected, answer, formatted)
    explanation = f"{match} match of {answer!r} vs expected {expected!r}"
    if not formatted:
        explanation += " (no ANSWER: line; read from the last line)"
    score = (1.0 if formatted else UNFORMATTED_ANSWER_SCORE) if ok else 0.0
    return VerifierResult(score=score, correct=ok, components={"format": float(formatted), "match": float(ok)},
                          explanation=explanation)  # fmt: skip
