"""Blind-review sessions built from two Inspect log dirs of the ``traffic`` family (candidate and baseline, same set).

One pair per item answered in both runs, by default only the items the set could not score automatically
(``needs_review``). Each pair has a stable ``pair_id`` (a hash of the session and the item) and holds the prompt
and the two answers in blind slots A and B, the candidate's slot drawn per pair from a seeded generator. What a
reviewer's browser receives is a :class:`BlindPair`: no model names and no slot mapping.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from feedback.review.errors import ReviewInputError

log = logging.getLogger(__name__)

Slot = Literal["A", "B"]
Choice = Literal["A", "B", "tie"]
CHOICES: tuple[Choice, ...] = ("A", "B", "tie")
# Session ids become part of registry names (``reviews-<session>``), so they follow the registry's alphabet.
_SESSION_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,95}$")


class AnswerRecord(Protocol):
    """One answer of the traffic family (``evalsuite.families.traffic.TrafficAnswer`` has these fields)."""

    @property
    def item_id(self) -> str: ...
    @property
    def set_ref(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def messages(self) -> Sequence[Any]: ...
    @property
    def answer(self) -> str: ...
    @property
    def tool_calls(self) -> Sequence[Any] | None: ...
    @property
    def signal(self) -> Any: ...
    @property
    def needs_review(self) -> bool: ...
    @property
    def error(self) -> str | None: ...


class ReviewMessage(BaseModel):
    """A prompt message as shown to reviewers: its role and its text."""

    role: str
    content: str


class ReviewAnswer(BaseModel):
    """One model's answer: its text and any tool calls it made (as JSON objects)."""

    text: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class BlindPair(BaseModel):
    """What a reviewer sees: the prompt and two unlabelled answers."""

    pair_id: str
    prompt: list[ReviewMessage]
    answer_a: ReviewAnswer
    answer_b: ReviewAnswer


class ReviewPair(BlindPair):
    """A pair as stored: the blind view plus what un-blinds it (never sent to a browser)."""

    session_id: str
    position: int = Field(ge=0, description="Order in which pairs are offered when vote counts tie.")
    item_id: str
    candidate_slot: Slot = Field(description="The blind slot holding the candidate's answer.")
    signal: str | None = Field(default=None, description="The set's verifiable signal for the item, if any.")
    needs_review: bool = True

    def blind(self) -> BlindPair:
        return BlindPair(
            pair_id=self.pair_id, prompt=self.prompt, answer_a=self.answer_a, answer_b=self.answer_b
        )

    def answer_of(self, side: Literal["candidate", "baseline"]) -> ReviewAnswer:
        candidate_first = self.candidate_slot == "A"
        return self.answer_a if (side == "candidate") == candidate_first else self.answer_b


class ReviewSession(BaseModel):
    """A blind-review session: which set and runs it compares and how many reviews each pair gets."""

    session_id: str
    set_ref: str
    candidate_model: str
    baseline_model: str
    reviews_per_pair: int = Field(
        default=3, ge=1, description="Reviews each pair collects before it is done."
    )
    seed: int = Field(default=0, description="Seed of the per-pair A/B placement.")
    include_auto_scored: bool = Field(
        default=False, description="Also pair items the set scored automatically."
    )
    candidate_logs: str = ""
    baseline_logs: str = ""
    n_pairs: int = 0
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


def validate_session_id(session_id: str) -> str:
    """``session_id`` if it is lowercase letters, digits, '.', '_' or '-' (it names a registry artifact)."""
    if not _SESSION_ID.match(session_id):
        raise ReviewInputError(
            f"invalid session id {session_id!r}: use 1-96 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return session_id


def default_session_id(set_ref: str) -> str:
    """A session id derived from the set ref: ``traffic-support@2026-w49`` -> ``traffic-support-2026-w49``."""
    return validate_session_id(re.sub(r"[^a-z0-9._-]+", "-", set_ref.lower()).strip("-._")[:96] or "review")


def pair_id_of(session_id: str, item_id: str) -> str:
    """A stable id for the pair of ``item_id`` in ``session_id`` (unique across sessions)."""
    return hashlib.sha256(f"{session_id}\x00{item_id}".encode()).hexdigest()[:16]


def candidate_slot_of(pair_id: str, seed: int) -> Slot:
    """The candidate's blind slot for one pair: a fair coin seeded by the session seed and the pair."""
    return "A" if random.Random(f"{seed}:{pair_id}").random() < 0.5 else "B"


def _plain(value: Any) -> Any:
    """A JSON-able copy of a pydantic model, mapping or list (other objects become their ``str``)."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json", exclude_none=True)
    return json.loads(json.dumps(value, default=str))


def _text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            part = _plain(part)
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("content") or f"[{part.get('type', 'part')}]"))
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def review_message(message: Any) -> ReviewMessage:
    """A chat message (a dict or a pydantic message) as role + text; tool calls it made are appended as JSON."""
    data = _plain(message)
    if not isinstance(data, dict):
        return ReviewMessage(role="user", content=str(data))
    content = _text(data.get("content"))
    if data.get("tool_calls"):
        content = (content + "\n" if content else "") + json.dumps(data["tool_calls"], indent=2)
    return ReviewMessage(role=str(data.get("role", "user")), content=content)


def review_answer(record: AnswerRecord) -> ReviewAnswer:
    calls = [_plain(call) for call in (record.tool_calls or [])]
    return ReviewAnswer(
        text=record.answer or "", tool_calls=[c if isinstance(c, dict) else {"call": c} for c in calls]
    )


def _one(values: set[str], what: str, where: str) -> str:
    if len(values) != 1:
        raise ReviewInputError(f"{where}: expected answers of one {what}, found {sorted(values) or 'none'}")
    return next(iter(values))


def plan_session(
    session_id: str,
    candidate: Mapping[str, AnswerRecord],
    baseline: Mapping[str, AnswerRecord],
    *,
    set_ref: str | None = None,
    reviews_per_pair: int = 3,
    seed: int = 0,
    include_auto_scored: bool = False,
    candidate_logs: str = "candidate logs",
    baseline_logs: str = "baseline logs",
) -> tuple[ReviewSession, list[ReviewPair]]:
    """The session and its pairs from the candidate's and the baseline's answers (``item_id`` -> answer).

    Both runs must answer the same set (``set_ref`` when given); items answered by only one run, or whose
    sample failed in either run (no answer to judge), are left out. Raises ReviewInputError naming the logs when
    the runs disagree or no item is left to review.
    """
    validate_session_id(session_id)
    if reviews_per_pair < 1:
        raise ReviewInputError(f"reviews_per_pair must be at least 1, got {reviews_per_pair}")
    if not candidate or not baseline:
        empty = candidate_logs if not candidate else baseline_logs
        raise ReviewInputError(f"{empty}: holds no answers of the traffic family")
    candidate_set = _one({a.set_ref for a in candidate.values()}, "set", candidate_logs)
    baseline_set = _one({a.set_ref for a in baseline.values()}, "set", baseline_logs)
    if candidate_set != baseline_set:
        raise ReviewInputError(
            f"the runs answered different sets: {candidate_logs} has {candidate_set!r}, "
            f"{baseline_logs} has {baseline_set!r}"
        )
    if set_ref is not None and set_ref != candidate_set:
        raise ReviewInputError(f"--set {set_ref!r} does not match the logs, which answered {candidate_set!r}")
    both = set(candidate) & set(baseline)
    failed = {i for i in both if candidate[i].error or baseline[i].error}
    if failed:
        log.warning("event=review_pairs_skipped reason=sample_error items=%d", len(failed))
    shared = sorted(both - failed)
    if not shared:
        raise ReviewInputError(
            f"no item of {candidate_set} was answered in both {candidate_logs} and {baseline_logs}"
        )
    chosen = [
        i for i in shared if include_auto_scored or candidate[i].needs_review or baseline[i].needs_review
    ]
    if not chosen:
        raise ReviewInputError(
            f"none of the {len(shared)} shared items of {candidate_set} needs review (all were scored "
            "automatically); pass --include-auto-scored to review them anyway"
        )
    pairs: list[ReviewPair] = []
    for item_id in sorted(chosen, key=lambda i: pair_id_of(session_id, i)):
        pair_id = pair_id_of(session_id, item_id)
        slot = candidate_slot_of(pair_id, seed)
        ours, theirs = review_answer(candidate[item_id]), review_answer(baseline[item_id])
        signal = candidate[item_id].signal
        pairs.append(
            ReviewPair(
                pair_id=pair_id,
                session_id=session_id,
                position=len(pairs),
                item_id=item_id,
                prompt=[review_message(m) for m in candidate[item_id].messages],
                answer_a=ours if slot == "A" else theirs,
                answer_b=theirs if slot == "A" else ours,
                candidate_slot=slot,
                signal=None if signal is None else str(signal),
                needs_review=candidate[item_id].needs_review or baseline[item_id].needs_review,
            )
        )
    session = ReviewSession(
        session_id=session_id,
        set_ref=candidate_set,
        candidate_model=" + ".join(sorted({a.model for a in candidate.values()})),
        baseline_model=" + ".join(sorted({a.model for a in baseline.values()})),
        reviews_per_pair=reviews_per_pair,
        seed=seed,
        include_auto_scored=include_auto_scored,
        candidate_logs=candidate_logs,
        baseline_logs=baseline_logs,
        n_pairs=len(pairs),
    )
    return session, pairs


def read_traffic_answers(log_dir: Path) -> dict[str, AnswerRecord]:
    """The answers in an Inspect log dir of the ``traffic`` family, by item id."""
    log_dir = Path(log_dir)
    if not log_dir.exists():
        raise ReviewInputError(f"{log_dir}: no such log directory")
    try:
        from evalsuite.families.traffic import read_answers
    except ImportError as exc:
        raise ReviewInputError(
            f"cannot read {log_dir}: the traffic eval family (evalsuite.families.traffic) is not available: {exc}"
        ) from exc
    answers: dict[str, AnswerRecord] = dict(read_answers(log_dir))
    return answers
