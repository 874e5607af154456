"""Un-blinding a review session: the gate's human-preference summary and the DPO preference pairs.

The summary (:class:`evalsuite.human_preference.HumanPreferenceSummary`) is what ``tandem gate
--human-preference FILE`` reads. The preference pairs are published as the registry artifact
``reviews-<session>`` (kind ``preferences``, ``pairs.jsonl`` of :class:`posttrain.dpo.PreferencePair`) with the
eval set as its parent, which ``tandem posttrain dpo --pairs reviews:<session>`` trains on.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from evalsuite.human_preference import HumanPreferenceSummary, PairPreference, win_rate_interval
from feedback.review.agreement import session_fleiss_kappa, votes_by_pair
from feedback.review.errors import ReviewError
from feedback.review.pairs import ReviewAnswer, ReviewPair
from feedback.review.store import ReviewStore
from infra.config import write_json
from infra.manifest import ArtifactManifest, Lineage
from infra.registry import open_registry
from posttrain.dpo import (
    PREFERENCES_FILE,
    PREFERENCES_KIND,
    PreferenceMessage,
    PreferencePair,
    review_artifact_name,
)

log = logging.getLogger(__name__)


def _unblind(pair: ReviewPair, counts: Counter[str]) -> PairPreference:
    ours = pair.candidate_slot
    theirs = "B" if ours == "A" else "A"
    return PairPreference(
        pair_id=pair.pair_id,
        item_id=pair.item_id,
        candidate_slot=ours,
        votes={"A": counts["A"], "B": counts["B"], "tie": counts["tie"]},
        wins=counts[ours],
        ties=counts["tie"],
        losses=counts[theirs],
    )


def summarise(
    store: ReviewStore, session_id: str, *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> HumanPreferenceSummary:
    """The session's un-blinded result: per-pair votes, win/tie/loss, win rate with its CI, Fleiss' kappa."""
    session = store.session(session_id)
    votes = store.votes(session_id)
    counts = votes_by_pair(votes)
    reviewed = [
        _unblind(pair, counts[pair.pair_id]) for pair in store.pairs(session_id) if pair.pair_id in counts
    ]
    rate = low = high = None
    if reviewed:
        rate, low, high = win_rate_interval([p.score for p in reviewed], confidence, resamples, seed)
    kappa, kappa_pairs = session_fleiss_kappa(votes)
    return HumanPreferenceSummary(
        session_id=session.session_id,
        set_ref=session.set_ref,
        candidate_model=session.candidate_model,
        baseline_model=session.baseline_model,
        pairs=reviewed,
        n_pairs=len(reviewed),
        n_votes=len(votes),
        reviewers=len({v.reviewer for v in votes}),
        wins=sum(p.wins for p in reviewed),
        ties=sum(p.ties for p in reviewed),
        losses=sum(p.losses for p in reviewed),
        win_rate=rate,
        confidence=confidence,
        ci_low=low,
        ci_high=high,
        bootstrap_resamples=resamples,
        seed=seed,
        fleiss_kappa=kappa,
        kappa_pairs=kappa_pairs,
    )


def write_summary(summary: HumanPreferenceSummary, path: Path) -> Path:
    """Write the summary as JSON (atomically) for ``tandem gate --human-preference``."""
    write_json(Path(path), summary.model_dump(mode="json"))
    return Path(path)


def _assistant(answer: ReviewAnswer) -> list[PreferenceMessage]:
    """An answer as the assistant turn DPO trains on; tool calls are kept as their JSON after the text."""
    import json

    text = answer.text
    if answer.tool_calls:
        text = (text + "\n" if text else "") + json.dumps(answer.tool_calls)
    return [PreferenceMessage(role="assistant", content=text)]


def preference_pairs(store: ReviewStore, session_id: str) -> tuple[list[PreferencePair], int]:
    """One pair per reviewed pair with a majority for one answer (chosen) over the other (rejected).

    Pairs whose votes end even between the answers, or whose most frequent vote is a tie, are dropped; the
    second value counts them.
    """
    counts = votes_by_pair(store.votes(session_id))
    pairs: list[PreferencePair] = []
    undecided = 0
    for pair in store.pairs(session_id):
        if pair.pair_id not in counts:
            continue
        votes = counts[pair.pair_id]
        if votes["A"] == votes["B"] or votes["tie"] >= max(votes["A"], votes["B"]):
            undecided += 1
            continue
        winner, loser = (
            (pair.answer_a, pair.answer_b) if votes["A"] > votes["B"] else (pair.answer_b, pair.answer_a)
        )
        pairs.append(
            PreferencePair(
                prompt=[PreferenceMessage(role=m.role, content=m.content) for m in pair.prompt],
                chosen=_assistant(winner),
                rejected=_assistant(loser),
                pair_id=pair.pair_id,
            )
        )
    return pairs, undecided


def publish_preferences(
    store: ReviewStore, session_id: str, registry_url: str | None = None, version: str | None = None
) -> ArtifactManifest:
    """Publish the session's majority preferences as ``reviews-<session>@<version>`` (default: UTC time)."""
    session = store.session(session_id)
    pairs, undecided = preference_pairs(store, session_id)
    if not pairs:
        raise ReviewError(
            f"review session {session_id!r} has no pair with a majority for one answer yet "
            f"({undecided} tied or undecided); nothing to publish"
        )
    registry = open_registry(registry_url)
    version = version or time.strftime("%Y%m%dt%H%M%Sz", time.gmtime())
    directory = Path(tempfile.mkdtemp(prefix="tandem-reviews-"))
    try:
        (directory / PREFERENCES_FILE).write_text("".join(p.model_dump_json() + "\n" for p in pairs))
        manifest = registry.publish(
            directory,
            review_artifact_name(session_id),
            version,
            kind=PREFERENCES_KIND,
            lineage=Lineage(
                parents=[session.set_ref],
                produced_by=f"tandem review export --session {session_id} --pairs",
                config={"session": session.model_dump(mode="json"), "aggregation": "majority, ties dropped"},
                metrics={"pairs": len(pairs), "undecided_dropped": undecided},
            ),
            metadata={"session_id": session_id, "set_ref": session.set_ref},
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    log.info(
        "event=review_preferences_published ref=%s pairs=%d dropped=%d", manifest.ref, len(pairs), undecided
    )
    return manifest
