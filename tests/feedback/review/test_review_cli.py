"""``tandem review create|sessions|report|export``: a thin shell with one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feedback.review import pairs as review_pairs
from feedback.review.cli import review_app
from feedback.review.errors import ReviewInputError, SessionExists, SessionNotFound
from feedback.review.store import open_review_store
from infra.registry import open_registry
from tests.conftest import REPO
from tests.feedback.review.conftest import BASELINE, CANDIDATE, SET_REF, answers


@pytest.fixture()
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two log dirs whose traffic answers are built directly (the family's reader is replaced)."""
    candidate, baseline = tmp_path / "logs-candidate", tmp_path / "logs-baseline"
    by_dir = {candidate: answers(CANDIDATE, 3), baseline: answers(BASELINE, 3)}
    monkeypatch.setattr(review_pairs, "read_traffic_answers", lambda log_dir: by_dir[Path(log_dir)])
    return candidate, baseline


def test_create_report_and_export(logs: tuple[Path, Path], database_url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    candidate, baseline = logs
    create = ["create", "--set", SET_REF, "--candidate-logs", str(candidate), "--baseline-logs", str(baseline),
              "--reviews-per-pair", "2", "--database", database_url]  # fmt: skip
    created = runner.invoke(review_app, create)
    assert created.exit_code == 0, created.output
    assert "traffic-support-2026-w49" in created.output and "3 pairs" in created.output
    again = runner.invoke(review_app, create)
    assert isinstance(again.exception, SessionExists)

    store = open_review_store(database_url)
    try:
        # In candidate terms: pair 0 win + win, pair 1 win + tie (no majority), pair 2 loss + loss.
        for pair, plan in zip(store.pairs("traffic-support-2026-w49"), (("win", "win"), ("win", "tie"),
                                                                        ("loss", "loss")), strict=True):  # fmt: skip
            blind = {
                "win": pair.candidate_slot,
                "loss": "B" if pair.candidate_slot == "A" else "A",
                "tie": "tie",
            }
            for reviewer, outcome in zip(("r1", "r2"), plan, strict=True):
                store.vote(pair.pair_id, reviewer, blind[outcome])
    finally:
        store.close()
    listed = runner.invoke(review_app, ["sessions", "--database", database_url])
    assert listed.exit_code == 0 and "traffic-support-2026-w49" in listed.output
    report = runner.invoke(review_app, ["report", "--session", "traffic-support-2026-w49", "--database", database_url,
                                        "--reviewer-a", "r1", "--reviewer-b", "r2"])  # fmt: skip
    assert report.exit_code == 0, report.output
    assert "3 / 1 / 2" in report.output and "0.583" in report.output and "Cohen" in report.output

    out = tmp_path / "human-preference.json"
    registry = f"file://{tmp_path / 'registry'}"
    exported = runner.invoke(review_app, ["export", "--session", "traffic-support-2026-w49", "--out", str(out),
                                          "--pairs", "--registry", registry, "--version", "v1",
                                          "--database", database_url])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    summary = json.loads(out.read_text())
    assert (summary["n_pairs"], summary["wins"], summary["ties"], summary["losses"]) == (3, 3, 1, 2)
    assert summary["win_rate"] == pytest.approx((1 + 0.75 + 0) / 3) and summary["reviewers"] == 2
    assert "reviews-traffic-support-2026-w49@v1 (2 pairs)" in exported.output
    manifest = open_registry(registry).manifest("reviews-traffic-support-2026-w49@v1")
    assert manifest.kind == "preferences" and manifest.lineage.metrics == {"pairs": 2, "undecided_dropped": 1}
    nothing = runner.invoke(
        review_app, ["export", "--session", "traffic-support-2026-w49", "--database", database_url]
    )
    assert isinstance(nothing.exception, ReviewInputError)


def test_an_unknown_session_is_one_clear_line(database_url: str) -> None:
    runner = CliRunner()
    result = runner.invoke(review_app, ["report", "--session", "ghost", "--database", database_url])
    assert isinstance(result.exception, SessionNotFound)
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "review", "export", "--session", "ghost", "--out", "x.json",
         "--database", database_url],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "error: no review session 'ghost'" in done.stderr and "Traceback" not in done.stderr
