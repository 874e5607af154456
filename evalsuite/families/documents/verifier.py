"""Documents verifier: the completion's ``ANSWER:`` line against the expected value (exact or numeric)."""

from __future__ import annotations

import math
import re

from evalsuite.schema import TaskInstance, VerifierResult

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
