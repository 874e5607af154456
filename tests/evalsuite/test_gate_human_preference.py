"""The gate's human-preference row: read from a blind-review summary file, never from the review database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from evalsuite import runner as eval_runner
from evalsuite.cli import gate_command
from evalsuite.errors import GateError
from evalsuite.gate import GatePolicy, SampleOutcome, evaluate_gate, human_preference_check
from evalsuite.gate_report import render_html, render_markdown
from evalsuite.human_preference import HumanPreferenceSummary, PairPreference, load_human_preference

OUTCOMES = [
    SampleOutcome(
        family="documents", model="tandem-standard", sample_id=str(i), epoch=1, score=1.0, correct=True
    )
    for i in range(8)
]


def policy(required: bool, margin: float = 0.05, min_pairs: int = 1) -> GatePolicy:
    return GatePolicy.model_validate({
        "families": {"documents": {"min_samples": 4}},
        "parity": {"required": False},
        "bootstrap_resamples": 500,
        "human_preference": {"required": required, "non_inferiority_margin": margin, "min_pairs": min_pairs},
    })  # fmt: skip


def summary(outcomes: list[tuple[int, int, int]], session: str = "support-w49") -> HumanPreferenceSummary:
    """A summary with one pair per (wins, ties, losses) triple for the candidate (its slot is A)."""
    pairs = [
        PairPreference(pair_id=f"p{i}", item_id=f"item-{i}", candidate_slot="A",
                       votes={"A": w, "B": loss, "tie": t}, wins=w, ties=t, losses=loss)
        for i, (w, t, loss) in enumerate(outcomes)
    ]  # fmt: skip
    return HumanPreferenceSummary(
        session_id=session, set_ref="traffic-support@2026-w49", candidate_model="cand", baseline_model="base",
        pairs=pairs, n_pairs=len(pairs), n_votes=sum(p.n_votes for p in pairs), reviewers=3,
        wins=sum(p.wins for p in pairs), ties=sum(p.ties for p in pairs), losses=sum(p.losses for p in pairs),
        win_rate=None, fleiss_kappa=0.42, kappa_pairs=len(pairs),
    )  # fmt: skip


PREFERRED = summary([(3, 0, 0)] * 12 + [(2, 1, 0)] * 6 + [(1, 1, 1)] * 2)
INFERIOR = summary([(0, 0, 3)] * 12 + [(0, 1, 2)] * 6 + [(1, 1, 1)] * 2)


def test_required_and_preferred_passes_with_a_row_in_the_reports() -> None:
    verdict = evaluate_gate(OUTCOMES, OUTCOMES, policy(required=True), PREFERRED)
    (row,) = [c for c in verdict.checks if c.kind == "human_preference"]
    assert verdict.passed and row.passed and row.name == "human preference [support-w49]"
    figures = row.preference
    assert (
        figures is not None
        and figures.n_pairs == 20
        and figures.reviewers == 3
        and figures.fleiss_kappa == 0.42
    )
    assert figures.win_rate == pytest.approx((12 * 1 + 6 * 2.5 / 3 + 2 * 0.5) / 20)
    assert figures.ci_low is not None and figures.ci_high is not None
    assert figures.threshold == pytest.approx(0.45)
    assert figures.threshold <= figures.ci_low <= figures.win_rate <= figures.ci_high
    markdown = render_markdown(verdict)
    assert "## Human preference (blind review)" in markdown
    assert "| PASS | human preference [support-w49] | human_preference | 20 |" in markdown
    assert "0.420" in markdown and "CI low >= 0.450" in markdown
    assert "win rate" in render_html(verdict)
    assert json.loads(verdict.model_dump_json())["checks"][-1]["preference"]["n_pairs"] == 20


def test_required_and_inferior_fails_the_gate() -> None:
    verdict = evaluate_gate(OUTCOMES, OUTCOMES, policy(required=True), INFERIOR)
    row = verdict.checks[-1]
    assert not verdict.passed and not row.passed and "reaches below 0.5 - margin = 0.450" in row.reason
    assert "- **human preference [support-w49]**" in render_markdown(verdict)


def test_optional_row_is_reported_but_never_fails() -> None:
    verdict = evaluate_gate(OUTCOMES, OUTCOMES, policy(required=False), INFERIOR)
    row = verdict.checks[-1]
    assert verdict.passed and row.passed and "reaches below" in row.reason and "optional" in row.reason
    without = evaluate_gate(OUTCOMES, OUTCOMES, policy(required=False))
    assert without.passed and not [c for c in without.checks if c.kind == "human_preference"]


def test_required_but_missing_fails_and_an_unreadable_file_is_an_error(tmp_path: Path) -> None:
    verdict = evaluate_gate(OUTCOMES, OUTCOMES, policy(required=True))
    row = verdict.checks[-1]
    assert (
        not verdict.passed and row.kind == "human_preference" and "no human-preference summary" in row.reason
    )
    few = human_preference_check(summary([(3, 0, 0)] * 2), policy(required=True, min_pairs=5))
    assert not few.passed and "2 reviewed pairs < minimum 5" in few.reason
    with pytest.raises(GateError, match=r"human\.json: no such human-preference file"):
        load_human_preference(tmp_path / "human.json")
    (tmp_path / "bad.json").write_text(json.dumps({"session_id": "s", "pairs": "many"}))
    with pytest.raises(GateError, match=r"bad\.json: pairs"):
        load_human_preference(tmp_path / "bad.json")
    (tmp_path / "garbage.json").write_text("{")
    with pytest.raises(GateError, match="not a readable human-preference JSON"):
        load_human_preference(tmp_path / "garbage.json")


def test_gate_cli_reads_the_human_preference_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eval_runner, "read_outcomes", lambda path: OUTCOMES)
    policy_file = tmp_path / "gate.yaml"
    policy_file.write_text(yaml.safe_dump(policy(required=True).model_dump(mode="json")))
    preferred, inferior = tmp_path / "preferred.json", tmp_path / "inferior.json"
    preferred.write_text(PREFERRED.model_dump_json())
    inferior.write_text(INFERIOR.model_dump_json())
    app = typer.Typer()
    app.command()(gate_command)
    runner = CliRunner()
    common = ["--candidate", str(tmp_path), "--baseline", str(tmp_path), "--policy", str(policy_file),
              "--report-dir", str(tmp_path / "report")]  # fmt: skip
    passed = runner.invoke(app, [*common, "--human-preference", str(preferred)])
    assert passed.exit_code == 0, passed.output
    assert "human preference [support-w49]" in passed.output
    verdict = json.loads((tmp_path / "report" / "verdict.json").read_text())
    assert verdict["policy"]["human_preference"]["required"] is True
    assert runner.invoke(app, [*common, "--human-preference", str(inferior)]).exit_code == 1
    assert runner.invoke(app, common).exit_code == 1  # required, no file given
    missing = runner.invoke(app, [*common, "--human-preference", str(tmp_path / "nope.json")])
    assert isinstance(missing.exception, GateError) and missing.exception.exit_code == 2
