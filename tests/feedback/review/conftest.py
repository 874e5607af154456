"""Builders for review tests: traffic answers made directly (no Inspect run), a key database, review-scoped keys."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from feedback.review.pairs import ReviewPair, ReviewSession, plan_session
from feedback.review.store import ReviewStore, open_review_store

SET_REF = "traffic-support@2026-w49"
CANDIDATE, BASELINE = "tandem-candidate", "tandem-baseline"
# Answer texts never name the model, so a test can check that no page reveals which answer is whose.
ANSWER_TEXT = {
    CANDIDATE: "Open Settings > Security and choose Reset password. We e-mail you a link that works for 30 minutes;\n"
    "if it expires, ask for a new one from the same page",
    BASELINE: "I am sorry to hear that. Please contact our support team, who can reset the password for you",
}


class Answer(BaseModel):
    """The fields of ``evalsuite.families.traffic.TrafficAnswer`` that a review session reads."""

    item_id: str
    set_ref: str = SET_REF
    model: str
    messages: list[dict[str, Any]]
    answer: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    signal: str | None = None
    auto_score: float | None = None
    needs_review: bool = True
    error: str | None = None


def answers(
    model: str, n: int, *, auto_scored: Sequence[int] = (), set_ref: str = SET_REF
) -> dict[str, Answer]:
    """``n`` answers of ``model``; the items in ``auto_scored`` carry a verifiable signal (no review needed)."""
    found = {}
    for i in range(n):
        auto = i in auto_scored
        found[f"item-{i}"] = Answer(
            item_id=f"item-{i}",
            set_ref=set_ref,
            model=model,
            messages=[
                {"role": "system", "content": "You are a support assistant."},
                {
                    "role": "user",
                    "content": f"My account is locked after three wrong passwords (case {i}). How do I "
                    "reset my password?",
                },
            ],
            answer=f"{ANSWER_TEXT.get(model, model)} (item {i}).",
            signal="json_valid" if auto else None,
            auto_score=1.0 if auto else None,
            needs_review=not auto,
        )
    return found


@pytest.fixture()
def database_url(tmp_path: Path) -> str:
    return str(tmp_path / "gateway.db")


@pytest.fixture()
def review_store(database_url: str) -> Iterator[ReviewStore]:
    store = open_review_store(database_url)
    yield store
    store.close()


def create_session(
    store: ReviewStore, session_id: str = "support-w49", n: int = 4, reviews_per_pair: int = 3, seed: int = 0
) -> tuple[ReviewSession, list[ReviewPair]]:
    session, pairs = plan_session(
        session_id, answers(CANDIDATE, n), answers(BASELINE, n), reviews_per_pair=reviews_per_pair, seed=seed
    )
    return store.create_session(session, pairs), pairs


def make_key(database_url: str, name: str, scopes: list[str]) -> str:
    """A plain API key named ``name`` with ``scopes`` in the gateway's key store."""
    from gateway.keys import open_key_store

    keys = open_key_store(database_url)
    try:
        return keys.create(name, "tests", scopes=scopes).key
    finally:
        keys.close()
