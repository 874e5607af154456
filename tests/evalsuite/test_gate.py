"""The release gate on real Inspect logs made with mockllm: identical candidates pass, degraded ones fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from evalsuite_oracles import documents_policy
from inspect_ai import eval as inspect_eval
from inspect_ai.model import get_model
from typer.testing import CliRunner

from evalsuite.cli import gate_command
from evalsuite.errors import GateError
from evalsuite.families.documents.task import documents
from evalsuite.gate import GatePolicy, SampleOutcome, evaluate_gate, mcnemar_exact_p, paired_comparison
from evalsuite.generators import generate_instances
from evalsuite.runner import run_gate

N = 12


def make_logs(directory: Path, runs: dict[str, tuple[str, int]]) -> Path:
    instances = generate_instances("documents", "test", N)
    models = [
        get_model(f"mockllm/{name}", custom_outputs=documents_policy(instances, mode, wrong_every))
        for name, (mode, wrong_every) in runs.items()
    ]
    logs = inspect_eval(documents(n=N), model=models, log_dir=str(directory), display="none")
    assert all(log.status == "success" for log in logs)
    return directory


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate")
    policy = root / "gate.yaml"
    policy.write_text(yaml.safe_dump({
        "families": {"documents": {"margin": 0.05, "min_samples": 10}},
        "parity": {"required": True, "margin": 0.03},
        "bootstrap_resamples": 500,
    }))  # fmt: skip
    return {
        "policy": policy,
        "baseline": make_logs(root / "baseline", {"tandem-standard": ("right", 1)}),
        "same": make_logs(root / "same", {"tandem-standard": ("right", 1), "tandem-fast": ("right", 1)}),
        "degraded": make_logs(
            root / "degraded", {"tandem-standard": ("wrong", 2), "tandem-fast": ("wrong", 2)}
        ),
        "fast_drift": make_logs(
            root / "drift", {"tandem-standard": ("right", 1), "tandem-fast": ("wrong", 3)}
        ),
    }


def test_identical_candidate_passes(logs: dict[str, Path], tmp_path: Path) -> None:
    verdict, markdown, page = run_gate(logs["same"], logs["baseline"], logs["policy"], tmp_path)
    assert verdict.passed, [c.reason for c in verdict.checks]
    assert markdown.read_text().startswith("# Release gate: PASS")
    assert "data:image/png;base64," in page.read_text()


def test_degraded_candidate_fails_with_reasons(logs: dict[str, Path], tmp_path: Path) -> None:
    verdict, markdown, page = run_gate(logs["degraded"], logs["baseline"], logs["policy"], tmp_path)
    assert not verdict.passed
    failed = [c for c in verdict.checks if not c.passed]
    assert failed and all(c.kind == "non_inferiority" for c in failed)
    assert all(c.comparison and c.comparison.diff == pytest.approx(-0.5) for c in failed)
    assert "reaches below" in markdown.read_text() and "Why it failed" in page.read_text()


def test_parity_failure_between_tiers(logs: dict[str, Path], tmp_path: Path) -> None:
    verdict, _, _ = run_gate(logs["fast_drift"], logs["baseline"], logs["policy"], tmp_path)
    parity = [c for c in verdict.checks if c.kind == "parity"]
    assert not verdict.passed and parity and not parity[0].passed


def test_cli_exit_codes(logs: dict[str, Path], tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(gate_command)
    runner = CliRunner()
    common = [
        "--baseline",
        str(logs["baseline"]),
        "--policy",
        str(logs["policy"]),
        "--report-dir",
        str(tmp_path),
    ]
    assert runner.invoke(app, ["--candidate", str(logs["same"]), *common]).exit_code == 0
    assert runner.invoke(app, ["--candidate", str(logs["degraded"]), *common]).exit_code == 1
    missing = runner.invoke(app, ["--candidate", str(tmp_path / "nope"), *common])
    assert isinstance(missing.exception, GateError) and missing.exception.exit_code == 2


def test_too_few_samples_fails_coverage() -> None:
    outcomes = [SampleOutcome(family="agent", model="m", sample_id=str(i), epoch=1, score=1, correct=True)
                for i in range(5)]  # fmt: skip
    policy = GatePolicy.model_validate(
        {"families": {"agent": {"min_samples": 10}}, "parity": {"required": False}}
    )
    verdict = evaluate_gate(outcomes, outcomes, policy)
    assert not verdict.passed and verdict.checks[0].kind == "coverage"


def test_statistics() -> None:
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(0, 10) < 0.01
    same = paired_comparison([1.0, 0.0] * 20, [1.0, 0.0] * 20, resamples=200)
    assert same.diff == 0 and same.ci_low == 0 and same.ci_high == 0
    worse = paired_comparison([0.0] * 20 + [1.0] * 20, [1.0] * 40, resamples=500)
    assert worse.diff == pytest.approx(-0.5) and worse.ci_high < 0 and worse.discordant_b_only == 20
