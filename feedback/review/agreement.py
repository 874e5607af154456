"""Agreement between reviewers: Fleiss' kappa over pairs with two or more votes, Cohen's kappa for two reviewers.

Both come from ``statsmodels.stats.inter_rater``. Its Fleiss' kappa requires the same number of ratings on every
subject, which a live session rarely has (a pair may hold 2, 3 or 4 votes); for that case this module computes
the usual generalisation, the same formula with each pair's own number of ratings n_i:
``P_i = (sum_j n_ij^2 - n_i) / (n_i (n_i - 1))``, ``p_j = sum_i n_ij / sum_i n_i``,
``kappa = (mean P_i - sum_j p_j^2) / (1 - sum_j p_j^2)``, which equals statsmodels' value when every n_i is equal.
A kappa is None when it is undefined: no pair with two votes, or every vote in one category (chance agreement 1).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

from feedback.review.pairs import CHOICES
from feedback.review.store import Vote


class CohenKappa(BaseModel):
    reviewer_a: str
    reviewer_b: str
    n_pairs: int = Field(description="Pairs both reviewers voted on.")
    kappa: float | None


def votes_by_pair(votes: Iterable[Vote]) -> dict[str, Counter[str]]:
    """Blind choice counts per pair id."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for vote in votes:
        table[vote.pair_id][vote.choice] += 1
    return dict(table)


def _chance_agreement(rows: Sequence[Sequence[int]]) -> float:
    totals = [sum(column) for column in zip(*rows, strict=True)]
    grand = sum(totals)
    return sum((t / grand) ** 2 for t in totals)


def fleiss_kappa(counts: Sequence[Sequence[int]]) -> float | None:
    """Fleiss' kappa of a subjects x categories table of rating counts; rows with fewer than two are left out."""
    rows = [[int(c) for c in row] for row in counts if sum(row) >= 2]
    if not rows:
        return None
    chance = _chance_agreement(rows)
    if chance >= 1.0 - 1e-12:
        return None
    if len({sum(row) for row in rows}) == 1:
        import numpy as np
        from statsmodels.stats.inter_rater import fleiss_kappa as statsmodels_fleiss_kappa

        return float(statsmodels_fleiss_kappa(np.asarray(rows, dtype=float), method="fleiss"))
    observed = [(sum(c * c for c in row) - sum(row)) / (sum(row) * (sum(row) - 1)) for row in rows]
    return (sum(observed) / len(observed) - chance) / (1 - chance)


def session_fleiss_kappa(votes: Iterable[Vote]) -> tuple[float | None, int]:
    """Fleiss' kappa over the pairs holding two or more votes, and how many pairs that is."""
    rows = [[counts[c] for c in CHOICES] for counts in votes_by_pair(votes).values() if counts.total() >= 2]
    return fleiss_kappa(rows), len(rows)


def cohens_kappa(votes: Iterable[Vote], reviewer_a: str, reviewer_b: str) -> CohenKappa:
    """Cohen's kappa between two reviewers over the pairs both voted on."""
    choices: dict[str, dict[str, str]] = defaultdict(dict)
    for vote in votes:
        if vote.reviewer in (reviewer_a, reviewer_b):
            choices[vote.pair_id][vote.reviewer] = vote.choice
    both = [(c[reviewer_a], c[reviewer_b]) for c in choices.values() if reviewer_a in c and reviewer_b in c]
    result = CohenKappa(reviewer_a=reviewer_a, reviewer_b=reviewer_b, n_pairs=len(both), kappa=None)
    if not both:
        return result
    index: dict[str, int] = {choice: i for i, choice in enumerate(CHOICES)}
    table = [[0] * len(CHOICES) for _ in CHOICES]
    for first, second in both:
        table[index[first]][index[second]] += 1
    n = len(both)
    rows = [sum(row) / n for row in table]
    columns = [sum(column) / n for column in zip(*table, strict=True)]
    if sum(r * c for r, c in zip(rows, columns, strict=True)) >= 1.0 - 1e-12:
        return result  # both reviewers always gave the same single answer: kappa is undefined
    import numpy as np
    from statsmodels.stats.inter_rater import cohens_kappa as statsmodels_cohens_kappa

    kappa = statsmodels_cohens_kappa(np.asarray(table, dtype=float), return_results=False)
    return result.model_copy(update={"kappa": float(kappa)})
