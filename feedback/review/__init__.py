"""Blind review of candidate vs baseline answers on a traffic eval set.

Sessions pair the two runs' answers per item (A/B in a seeded random order, model names hidden); reviewers vote in
a web app (``tandem review serve``) signed in with review-scoped API keys; votes live in the gateway's key
database. From the votes come agreement (Fleiss' and Cohen's kappa), the gate's human-preference summary and
DPO preference pairs published to the registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from feedback.review.agreement import CohenKappa, cohens_kappa, fleiss_kappa, session_fleiss_kappa
from feedback.review.errors import (
    NotSignedIn,
    PairNotFound,
    ReviewError,
    ReviewInputError,
    ReviewScopeMissing,
    SessionExists,
    SessionNotFound,
)
from feedback.review.pairs import BlindPair, ReviewPair, ReviewSession, plan_session, read_traffic_answers
from feedback.review.results import preference_pairs, publish_preferences, summarise, write_summary
from feedback.review.store import ReviewProgress, ReviewStore, Vote, open_review_store

if TYPE_CHECKING:
    from feedback.review.app import build_review_app

__all__ = [
    "BlindPair",
    "CohenKappa",
    "NotSignedIn",
    "PairNotFound",
    "ReviewError",
    "ReviewInputError",
    "ReviewPair",
    "ReviewProgress",
    "ReviewScopeMissing",
    "ReviewSession",
    "ReviewStore",
    "SessionExists",
    "SessionNotFound",
    "Vote",
    "build_review_app",
    "cohens_kappa",
    "fleiss_kappa",
    "open_review_store",
    "plan_session",
    "preference_pairs",
    "publish_preferences",
    "read_traffic_answers",
    "session_fleiss_kappa",
    "summarise",
    "write_summary",
]


def __getattr__(name: str) -> Any:
    """``build_review_app`` imports FastAPI and uvicorn only when asked for."""
    if name == "build_review_app":
        from feedback.review.app import build_review_app

        return build_review_app
    raise AttributeError(name)
