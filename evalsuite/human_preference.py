"""The gate's human-preference input: a blind-review summary read from a JSON file.

``tandem review export --session S --out FILE`` writes :class:`HumanPreferenceSummary`; the gate reads the file,
never the review database (the review tool sits above the eval suite). A pair's score is the candidate's share
of its votes, a tie counting half; the win rate is the mean score over reviewed pairs, so each pair weighs the
same however many reviewers saw it. Its confidence interval is a percentile bootstrap over pairs (a cluster
bootstrap: a pair's votes are not independent of each other), the method the gate's other rows use.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from evalsuite.errors import GateError

Slot = Literal["A", "B"]
CI_METHOD = "percentile bootstrap over pairs"


class HumanPreferencePolicy(BaseModel):
    """The gate policy's ``human_preference`` section."""

    required: bool = Field(
        default=False,
        description="Fail the gate when no summary is given or the candidate is inferior; when false a given "
        "summary is reported but never fails the gate.",
    )
    non_inferiority_margin: float = Field(
        default=0.05,
        ge=0.0,
        le=0.5,
        description="Non-inferior when the win rate's lower confidence bound is at least 0.5 - margin.",
    )
    min_pairs: int = Field(default=1, ge=1, description="Fewer reviewed pairs than this fails the row.")


class PairPreference(BaseModel):
    """One reviewed pair, un-blinded: its blind vote counts and the candidate's wins, ties and losses."""

    pair_id: str
    item_id: str
    candidate_slot: Slot = Field(description="Which blind slot (A or B) held the candidate's answer.")
    votes: dict[Literal["A", "B", "tie"], int] = Field(description="Votes per blind choice.")
    wins: int = Field(ge=0)
    ties: int = Field(ge=0)
    losses: int = Field(ge=0)

    @property
    def n_votes(self) -> int:
        return self.wins + self.ties + self.losses

    @property
    def score(self) -> float:
        """The candidate's share of this pair's votes, ties counting half (0.5 with no votes)."""
        return (self.wins + 0.5 * self.ties) / self.n_votes if self.n_votes else 0.5


class HumanPreferenceSummary(BaseModel):
    """A blind-review session's result, as ``tandem review export`` writes it and the gate reads it."""

    session_id: str
    set_ref: str = Field(description="Registry ref of the eval set the answers came from.")
    candidate_model: str
    baseline_model: str
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    pairs: list[PairPreference] = Field(description="Every pair with at least one vote.")
    n_pairs: int = Field(ge=0, description="Pairs with at least one vote.")
    n_votes: int = Field(ge=0)
    reviewers: int = Field(ge=0, description="Distinct reviewers who voted.")
    wins: int = Field(ge=0, description="Votes for the candidate.")
    ties: int = Field(ge=0)
    losses: int = Field(ge=0, description="Votes for the baseline.")
    win_rate: float | None = Field(description="Mean pair score (ties half); None with no votes.")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    ci_low: float | None = None
    ci_high: float | None = None
    ci_method: str = CI_METHOD
    bootstrap_resamples: int = Field(default=2000, ge=100)
    seed: int = 0
    fleiss_kappa: float | None = Field(
        default=None, description="Agreement over pairs with two or more votes; None when undefined."
    )
    kappa_pairs: int = Field(default=0, ge=0, description="Pairs the kappa was computed on (>= 2 votes).")


class HumanPreferenceResult(BaseModel):
    """What the gate's human-preference row shows."""

    session_id: str
    n_pairs: int
    n_votes: int
    reviewers: int
    win_rate: float | None
    ci_low: float | None
    ci_high: float | None
    threshold: float = Field(description="0.5 - margin: the lowest lower bound that passes.")
    fleiss_kappa: float | None


def win_rate_interval(
    scores: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of the per-pair ``scores`` and its percentile bootstrap interval over pairs."""
    if not scores:
        raise GateError("a win rate needs at least one reviewed pair")
    n = len(scores)
    rng = random.Random(seed)
    means = sorted(sum(scores[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    alpha = (1 - confidence) / 2
    low = means[math.floor(alpha * (resamples - 1))]
    high = means[math.ceil((1 - alpha) * (resamples - 1))]
    return sum(scores) / n, low, high


def load_human_preference(path: str | Path) -> HumanPreferenceSummary:
    """Read a summary written by ``tandem review export``; a missing or malformed file is a GateError naming it."""
    path = Path(path)
    if not path.is_file():
        raise GateError(
            f"{path}: no such human-preference file (write it with `tandem review export --session S --out {path}`)"
        )
    try:
        return HumanPreferenceSummary.model_validate(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise GateError(f"{path}: not a readable human-preference JSON file: {exc}") from exc
    except ValidationError as exc:
        from infra.config import describe_validation_error

        raise GateError(describe_validation_error(exc, str(path))) from exc
