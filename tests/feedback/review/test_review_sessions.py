"""Review sessions: pairing, blind A/B placement, storage, the next-pair rule, votes, un-blinding and export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsuite.human_preference import load_human_preference
from feedback.review.errors import (
    PairNotFound,
    ReviewError,
    ReviewInputError,
    SessionExists,
    SessionNotFound,
)
from feedback.review.pairs import plan_session
from feedback.review.results import preference_pairs, publish_preferences, summarise, write_summary
from feedback.review.store import ReviewStore, open_review_store
from infra.registry import open_registry
from posttrain.dpo import PREFERENCES_FILE, review_pairs
from tests.feedback.review.conftest import ANSWER_TEXT, BASELINE, CANDIDATE, SET_REF, answers, create_session


def test_pairs_cover_shared_items_needing_review_in_a_seeded_blind_order() -> None:
    candidate = answers(CANDIDATE, 20, auto_scored=[3, 7])
    baseline = answers(BASELINE, 20, auto_scored=[3, 7])
    del baseline["item-19"]  # answered by the candidate only: no pair
    baseline["item-5"] = baseline["item-5"].model_copy(
        update={"answer": "", "error": "timed out"}
    )  # no answer
    session, pairs = plan_session("s1", candidate, baseline, set_ref=SET_REF)
    assert session.set_ref == SET_REF and session.n_pairs == len(pairs) == 16
    assert {p.item_id for p in pairs} == {f"item-{i}" for i in range(19)} - {"item-3", "item-5", "item-7"}
    assert (session.candidate_model, session.baseline_model) == (CANDIDATE, BASELINE)
    # Stable: the same inputs give the same ids and the same A/B placement.
    again = plan_session("s1", candidate, baseline)[1]
    assert [(p.pair_id, p.candidate_slot) for p in again] == [(p.pair_id, p.candidate_slot) for p in pairs]
    # Random per pair: both slots occur, and another seed places some pairs differently.
    assert {p.candidate_slot for p in pairs} == {"A", "B"}
    reseeded = {p.pair_id: p.candidate_slot for p in plan_session("s1", candidate, baseline, seed=1)[1]}
    assert any(reseeded[p.pair_id] != p.candidate_slot for p in pairs)
    for pair in pairs:
        assert pair.answer_of("candidate").text.startswith(ANSWER_TEXT[CANDIDATE])
        assert pair.answer_of("baseline").text.startswith(ANSWER_TEXT[BASELINE])
        assert [m.role for m in pair.prompt] == ["system", "user"]
        blind = pair.blind().model_dump_json()
        assert "candidate_slot" not in blind and "item_id" not in blind
    with_auto = plan_session("s1", candidate, baseline, include_auto_scored=True)[1]
    assert len(with_auto) == 18
    # Pair ids are unique across sessions.
    assert not {p.pair_id for p in plan_session("s2", candidate, baseline)[1]} & {p.pair_id for p in pairs}


def test_session_inputs_that_do_not_make_a_session_are_refused_by_name() -> None:
    candidate, baseline = answers(CANDIDATE, 3), answers(BASELINE, 3)
    other_set = answers(BASELINE, 3, set_ref="traffic-support@2026-w50")
    with pytest.raises(ReviewInputError, match=r"different sets.*2026-w49.*2026-w50"):
        plan_session("s1", candidate, other_set)
    with pytest.raises(ReviewInputError, match="--set 'traffic-billing@2026-w49' does not match"):
        plan_session("s1", candidate, baseline, set_ref="traffic-billing@2026-w49")
    with pytest.raises(ReviewInputError, match="no item"):
        plan_session(
            "s1", candidate, {"other": answers(BASELINE, 4)["item-3"].model_copy(update={"item_id": "x"})}
        )
    with pytest.raises(ReviewInputError, match="include-auto-scored"):
        plan_session(
            "s1", answers(CANDIDATE, 2, auto_scored=[0, 1]), answers(BASELINE, 2, auto_scored=[0, 1])
        )
    with pytest.raises(ReviewInputError, match="invalid session id"):
        plan_session("Not OK", candidate, baseline)
    with pytest.raises(ReviewInputError, match="holds no answers"):
        plan_session("s1", candidate, {}, baseline_logs="logs/base")


def test_store_keeps_sessions_and_refuses_unknown_or_duplicate_ones(
    review_store: ReviewStore, database_url: str
) -> None:
    session, pairs = create_session(review_store, "support-w49", n=3)
    with pytest.raises(SessionExists, match="support-w49"):
        create_session(review_store, "support-w49", n=3)
    with pytest.raises(SessionNotFound, match=r"no review session 'nope'.*support-w49"):
        review_store.session("nope")
    with pytest.raises(SessionNotFound):
        review_store.next_pair("nope", "tk-reviewer")
    with pytest.raises(PairNotFound, match="no review pair 'missing'"):
        review_store.vote("missing", "tk-r1", "A")
    # Another process opening the same database sees the same session (schema creation is idempotent).
    other = open_review_store(database_url)
    try:
        assert other.session("support-w49") == session
        assert [p.pair_id for p in other.pairs("support-w49")] == [p.pair_id for p in pairs]
    finally:
        other.close()


def test_next_pair_prefers_fewest_votes_until_each_pair_has_its_reviews(review_store: ReviewStore) -> None:
    _, pairs = create_session(review_store, "quota", n=3, reviews_per_pair=2)
    p0, p1, p2 = (p.pair_id for p in pairs)
    sid = "quota"

    def next_for(reviewer: str) -> str | None:
        pair = review_store.next_pair(sid, reviewer)
        return None if pair is None else pair.pair_id

    assert next_for("r1") == p0
    review_store.vote(p0, "r1", "A")
    assert next_for("r2") == p1  # p1 and p2 have no vote yet; p1 comes first
    review_store.vote(p1, "r2", "B")
    assert next_for("r3") == p2
    review_store.vote(p2, "r3", "tie")
    assert next_for("r1") == p1  # never a pair r1 has voted on
    assert next_for("r3") == p0
    review_store.vote(p0, "r3", "A")  # p0 reaches its 2 reviews
    assert next_for("r4") == p1
    review_store.vote(p1, "r4", "A")
    review_store.vote(p2, "r4", "B")
    assert next_for("r5") is None  # every pair has its reviews
    progress = review_store.progress(sid, "r4")
    assert (progress.total_pairs, progress.voted_by_reviewer, progress.complete_pairs) == (3, 2, 3)
    assert progress.left_for_reviewer == 0


def test_a_revote_replaces_the_earlier_vote(review_store: ReviewStore) -> None:
    _, pairs = create_session(review_store, "revote", n=2)
    review_store.vote(pairs[0].pair_id, "r1", "A", "clearer")
    review_store.vote(pairs[0].pair_id, "r1", "tie", "  ")
    (vote,) = review_store.votes("revote")
    assert (vote.reviewer, vote.choice, vote.reason) == ("r1", "tie", None)
    with pytest.raises(ReviewInputError, match="invalid choice 'C'"):
        review_store.vote(pairs[0].pair_id, "r1", "C")
    with pytest.raises(ReviewInputError, match="limit is 2000"):
        review_store.vote(pairs[0].pair_id, "r1", "A", "x" * 2001)


def _vote_as(store: ReviewStore, pair_id: str, candidate_slot: str, outcomes: list[str]) -> None:
    """Vote in candidate terms (win / tie / loss), translated to the pair's blind slots."""
    other = "B" if candidate_slot == "A" else "A"
    blind = {"win": candidate_slot, "tie": "tie", "loss": other}
    for reviewer, outcome in enumerate(outcomes):
        store.vote(pair_id, f"r{reviewer}", blind[outcome])


def test_summary_unblinds_votes_into_win_rate_ci_and_kappa(review_store: ReviewStore, tmp_path: Path) -> None:
    _, pairs = create_session(review_store, "summary", n=5)
    plan = [["win", "win", "win"], ["win", "win", "tie"], ["loss", "loss", "loss"], ["tie", "win", "loss"]]
    for pair, outcomes in zip(pairs, plan, strict=False):
        _vote_as(review_store, pair.pair_id, pair.candidate_slot, outcomes)
    summary = summarise(review_store, "summary", resamples=500)
    assert (summary.n_pairs, summary.n_votes, summary.reviewers) == (4, 12, 3)  # the fifth pair has no vote
    assert (summary.wins, summary.ties, summary.losses) == (6, 2, 4)
    scores = [1.0, (2 + 0.5) / 3, 0.0, 0.5]
    assert summary.win_rate == pytest.approx(sum(scores) / 4)
    assert summary.ci_low is not None and summary.ci_high is not None
    assert 0.0 <= summary.ci_low <= summary.win_rate <= summary.ci_high <= 1.0
    assert summary.kappa_pairs == 4 and summary.fleiss_kappa is not None
    by_pair = {p.pair_id: p for p in summary.pairs}
    assert by_pair[pairs[0].pair_id].votes[pairs[0].candidate_slot] == 3
    path = write_summary(summary, tmp_path / "human.json")
    assert load_human_preference(path) == summary
    assert json.loads(path.read_text())["candidate_model"] == CANDIDATE


def test_preference_pairs_take_the_majority_and_drop_ties(review_store: ReviewStore, tmp_path: Path) -> None:
    _, pairs = create_session(review_store, "prefs", n=4)
    _vote_as(review_store, pairs[0].pair_id, pairs[0].candidate_slot, ["win", "win", "loss"])
    _vote_as(review_store, pairs[1].pair_id, pairs[1].candidate_slot, ["loss", "loss", "tie"])
    _vote_as(review_store, pairs[2].pair_id, pairs[2].candidate_slot, ["win", "loss", "tie"])  # even: dropped
    _vote_as(
        review_store, pairs[3].pair_id, pairs[3].candidate_slot, ["tie", "tie", "win"]
    )  # tie wins: dropped
    found, undecided = preference_pairs(review_store, "prefs")
    assert undecided == 2 and [p.pair_id for p in found] == [pairs[0].pair_id, pairs[1].pair_id]
    ours, theirs = ANSWER_TEXT[CANDIDATE], ANSWER_TEXT[BASELINE]
    assert found[0].chosen[0].content.startswith(ours) and found[0].rejected[0].content.startswith(theirs)
    assert found[1].chosen[0].content.startswith(theirs) and found[1].rejected[0].content.startswith(ours)
    assert [m.role for m in found[0].prompt] == ["system", "user"] and found[0].chosen[0].role == "assistant"

    registry_url = f"file://{tmp_path / 'registry'}"
    manifest = publish_preferences(review_store, "prefs", registry_url, version="v1")
    assert (manifest.ref, manifest.kind) == ("reviews-prefs@v1", "preferences")
    assert manifest.lineage.parents == [SET_REF] and manifest.lineage.metrics == {
        "pairs": 2,
        "undecided_dropped": 2,
    }
    registry = open_registry(registry_url)
    assert len((registry.fetch("reviews-prefs@v1") / PREFERENCES_FILE).read_text().splitlines()) == 2
    # The contract with posttrain: DPO reads back exactly these pairs.
    ref, read = review_pairs(registry, "reviews:prefs")
    assert ref == "reviews-prefs@v1" and read == found


def test_nothing_decisive_is_not_published(review_store: ReviewStore, tmp_path: Path) -> None:
    _, pairs = create_session(review_store, "undecided", n=1)
    review_store.vote(pairs[0].pair_id, "r1", "tie")
    with pytest.raises(ReviewError, match="no pair with a majority"):
        publish_preferences(review_store, "undecided", f"file://{tmp_path / 'registry'}")
    with pytest.raises(SessionNotFound):
        publish_preferences(review_store, "ghost", f"file://{tmp_path / 'registry'}")


@pytest.mark.integration
def test_the_store_runs_on_postgresql(postgres_database_url: str) -> None:
    store = open_review_store(postgres_database_url)
    try:
        open_review_store(postgres_database_url).close()  # a second opener finds the tables in place
        _, pairs = create_session(store, "pg", n=3, reviews_per_pair=1)
        first = store.next_pair("pg", "r1")
        assert first is not None and first.pair_id == pairs[0].pair_id
        store.vote(pairs[0].pair_id, "r1", "A", "first")
        store.vote(pairs[0].pair_id, "r1", "B", "changed my mind")
        (vote,) = store.votes("pg")
        assert (vote.choice, vote.reason) == ("B", "changed my mind")
        second = store.next_pair("pg", "r2")
        assert second is not None and second.pair_id == pairs[1].pair_id
        progress = store.progress("pg", "r1")
        assert (progress.voted_by_reviewer, progress.left_for_reviewer, progress.complete_pairs) == (1, 2, 1)
        assert summarise(store, "pg", resamples=200).n_votes == 1
        with pytest.raises(SessionExists):
            create_session(store, "pg", n=1)
    finally:
        store.close()
