"""Agreement figures on fixed vote sets, against textbook and hand-computed values."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from feedback.review.agreement import cohens_kappa, fleiss_kappa, session_fleiss_kappa
from feedback.review.store import Vote

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def votes(table: dict[str, list[str]]) -> list[Vote]:
    """One vote per (pair, position): reviewer ``r<position>`` chose ``choice``."""
    return [
        Vote(session_id="s", pair_id=pair, reviewer=f"r{i}", choice=choice, voted_at=NOW)  # type: ignore[arg-type]
        for pair, choices in table.items()
        for i, choice in enumerate(choices)
    ]


def test_fleiss_kappa_matches_the_textbook_example() -> None:
    # Fleiss (1971) as worked on Wikipedia's "Fleiss' kappa" page: 10 subjects, 14 raters, 5 categories.
    table = [
        [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
    ]  # fmt: skip
    assert fleiss_kappa(table) == pytest.approx(0.210, abs=5e-4)


def test_fleiss_kappa_on_a_fixed_vote_set() -> None:
    # Counts (A, B, tie): p1 (3,0,0) p2 (2,1,0) p3 (0,2,1) p4 (0,0,3). P_i = 1, 1/3, 1/3, 1 -> mean 2/3;
    # p_j = 5/12, 3/12, 4/12 -> P_e = 50/144; kappa = (2/3 - 50/144) / (1 - 50/144) = 23/47.
    fixed = {"p1": ["A", "A", "A"], "p2": ["A", "A", "B"], "p3": ["B", "B", "tie"], "p4": ["tie"] * 3}
    kappa, pairs = session_fleiss_kappa(votes(fixed))
    assert pairs == 4 and kappa == pytest.approx(23 / 47)


def test_fleiss_kappa_with_uneven_vote_counts_uses_each_pairs_own_count() -> None:
    # As above plus p5 (1,1,0) with P_5 = 0, and p6 with one vote (left out). Mean P_i = (8/3)/5 = 8/15;
    # totals A 6, B 4, tie 4 of 14 -> P_e = 68/196; kappa = (8/15 - 68/196) / (1 - 68/196) = 137/480.
    fixed = {
        "p1": ["A", "A", "A"], "p2": ["A", "A", "B"], "p3": ["B", "B", "tie"], "p4": ["tie"] * 3,
        "p5": ["A", "B"], "p6": ["B"],
    }  # fmt: skip
    kappa, pairs = session_fleiss_kappa(votes(fixed))
    assert pairs == 5 and kappa == pytest.approx(137 / 480)


def test_fleiss_kappa_is_undefined_without_two_votes_or_with_one_category() -> None:
    assert session_fleiss_kappa(votes({"p1": ["A"], "p2": ["B"]})) == (None, 0)
    assert session_fleiss_kappa(votes({"p1": ["A", "A"], "p2": ["A", "A"]})) == (None, 2)
    assert fleiss_kappa([]) is None


def test_cohens_kappa_matches_the_textbook_example() -> None:
    # Wikipedia's "Cohen's kappa" example: 50 proposals, yes/yes 20, yes/no 5, no/yes 10, no/no 15 -> 0.4.
    plan = [("A", "A")] * 20 + [("A", "B")] * 5 + [("B", "A")] * 10 + [("B", "B")] * 15
    fixed = [
        Vote(session_id="s", pair_id=f"p{i}", reviewer=reviewer, choice=choice, voted_at=NOW)  # type: ignore[arg-type]
        for i, pair in enumerate(plan)
        for reviewer, choice in zip(("alice", "bob"), pair, strict=True)
    ]
    fixed.append(Vote(session_id="s", pair_id="extra", reviewer="alice", choice="tie", voted_at=NOW))
    fixed.append(Vote(session_id="s", pair_id="p0", reviewer="carol", choice="B", voted_at=NOW))
    result = cohens_kappa(fixed, "alice", "bob")
    assert result.n_pairs == 50 and result.kappa == pytest.approx(0.4)
    assert cohens_kappa(fixed, "alice", "dave").model_dump() == {
        "reviewer_a": "alice", "reviewer_b": "dave", "n_pairs": 0, "kappa": None,
    }  # fmt: skip
    same = [v for v in fixed if v.pair_id in {"p0", "p1"}]  # both said A on both: kappa undefined
    assert cohens_kappa(same, "alice", "bob").kappa is None
