"""Rollout config validation, the sticky split the ingress applies, gate reports, and threshold analysis."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.traffic import assign_release
from infra.errors import ConfigError, RolloutError
from infra.registry import FileRegistry
from release.gate_verdict import parse_gate_report, read_gate_verdict
from release.rollout import (
    AnalysisThresholds,
    GateRequirement,
    RolloutConfig,
    WindowMetrics,
    evaluate_analysis,
    load_rollout_config,
)

REPO = Path(__file__).resolve().parents[2]


def base_config() -> dict[str, Any]:
    return {
        "name": "demo",
        "stable": {"model": "m@v1"},
        "candidate": {"model": "m@v2", "draft": "d@v2"},
        "gate": {"path": "gate-report.md"},
        "steps": [{"weight": 10}, {"weight": 50}, {"weight": 100}],
    }


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_rollout_yaml_parses() -> None:
    config = load_rollout_config(REPO / "release" / "rollout.yaml")
    assert [step.weight for step in config.steps] == [10, 50, 100]
    last = config.thresholds(2)
    assert (
        last.error_rate is not None and last.error_rate.max == 0.01 and last.error_rate.max_increase is None
    )
    assert last.p99_ttft_seconds == config.analysis.p99_ttft_seconds  # not overridden: inherited


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"steps": [{"weight": 50}, {"weight": 10}, {"weight": 100}]}, "steps", "strictly increasing"),
        ({"steps": [{"weight": 10}, {"weight": 50}]}, "steps", "must be 100"),
        ({"steps": []}, "steps", "at least 1"),
        ({"steps": [{"weight": 0}, {"weight": 100}]}, "steps.0.weight", "greater than or equal to 1"),
        ({"steps": [{"weight": 100, "min_requests": -1}]}, "steps.0.min_requests", "greater than or equal"),
        ({"candidate": {"model": "Bad Ref"}}, "candidate.model", "invalid artifact name"),
        ({"gate": {"path": "a.md", "ref": "gate@v1"}}, "gate", "exactly one"),
        ({"gate": {}}, "gate", "exactly one"),
        ({"analysis": {"error_rate": {}}}, "analysis.error_rate", "at least one of max"),
        ({"analysis": {"latency": {"max": 1}}}, "analysis.latency", "Extra inputs"),
        ({"candidate": {"model": "m@v1"}}, "<root>", "identical to stable"),
        ({"name": "Has Spaces"}, "name", "lowercase"),
        ({"metrics": {"release_selectors": {"stable": {}}}}, "metrics", "stable' and 'candidate"),
    ],
)
def test_invalid_files_name_the_file_and_field(
    tmp_path: Path, change: dict[str, Any], field: str, message: str
) -> None:
    path = write(tmp_path, base_config() | change)
    with pytest.raises(ConfigError) as caught:
        load_rollout_config(path)
    text = str(caught.value)
    assert f"{path}: {field}" in text and message in text, text


def test_step_analysis_overrides_per_metric() -> None:
    config = RolloutConfig.model_validate(
        base_config()
        | {
            "analysis": {"error_rate": {"max": 0.05}, "acceptance_rate": {"min": 0.5}},
            "steps": [{"weight": 10, "analysis": {"error_rate": {"max": 0.01}}}, {"weight": 100}],
        }
    )
    assert config.thresholds(0).error_rate is not None and config.thresholds(0).error_rate.max == 0.01
    assert config.thresholds(0).acceptance_rate == config.analysis.acceptance_rate
    assert config.thresholds(1).error_rate is not None and config.thresholds(1).error_rate.max == 0.05


# ---------------------------------------------------------------------------------------------- split
def test_assign_release_distribution_matches_the_weight() -> None:
    keys = [f"sk-user-{i}" for i in range(20000)]
    for weight in (1, 10, 50, 90):
        share = Counter(assign_release(k, weight, "salt") for k in keys)["candidate"] / len(keys)
        assert abs(share - weight / 100) < 0.012, (weight, share)


def test_assign_release_is_sticky_and_monotonic_in_the_weight() -> None:
    keys = [f"session-{i}" for i in range(3000)]
    at_10 = {k for k in keys if assign_release(k, 10, "r1") == "candidate"}
    assert at_10 == {k for k in keys if assign_release(k, 10, "r1") == "candidate"}  # same answer again
    at_50 = {k for k in keys if assign_release(k, 50, "r1") == "candidate"}
    assert at_10 < at_50  # raising the weight only moves stable clients over
    assert all(assign_release(k, 0, "r1") == "stable" for k in keys)
    assert all(assign_release(k, 100, "r1") == "candidate" for k in keys)
    reshuffled = {k for k in keys if assign_release(k, 10, "r2") == "candidate"}
    assert reshuffled != at_10  # the salt decides which clients go first
    with pytest.raises(ValueError, match=r"0\.\.100"):
        assign_release("k", 101, "r1")


# ---------------------------------------------------------------------------------------------- gate
def test_gate_markdown_and_json_reports() -> None:
    assert parse_gate_report("# Release gate: PASS\n\nbody", "r.md", "passed") == "pass"
    assert parse_gate_report("intro\n# Release gate: FAIL\n", "r.md", "passed") == "fail"
    assert parse_gate_report(json.dumps({"passed": True}), "r.json", "passed") == "pass"
    assert parse_gate_report(json.dumps({"gate": {"verdict": "FAIL"}}), "r.json", "gate.verdict") == "fail"
    with pytest.raises(RolloutError, match="no field 'verdict'"):
        parse_gate_report(json.dumps({"passed": True}), "r.json", "verdict")
    with pytest.raises(RolloutError, match="PASS\\|FAIL"):
        parse_gate_report("no verdict here", "r.md", "passed")


def test_gate_report_from_the_registry(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry")
    report = tmp_path / "report"
    report.mkdir()
    (report / "gate-report.md").write_text("# Release gate: PASS\n")
    registry.publish(report, "gate-demo", "v2", kind="report")
    verdict, source = read_gate_verdict(GateRequirement(ref="gate-demo@v2"), registry)
    assert (verdict, source) == ("pass", "gate-demo@v2:gate-report.md")
    with pytest.raises(RolloutError, match=r"no file 'gate\.json'"):
        read_gate_verdict(GateRequirement(ref="gate-demo@v2", file="gate.json"), registry)
    with pytest.raises(RolloutError, match="cannot read"):
        read_gate_verdict(GateRequirement(path=tmp_path / "missing.md"), registry)


def _verdict(passed: bool) -> Any:
    from evalsuite.gate import GateCheck, GatePolicy, GateVerdict

    check = GateCheck(name="documents", kind="non_inferiority", family="documents", passed=passed, reason="r")
    return GateVerdict(
        passed=passed, checks=[check], candidate_models=["c"], baseline_models=["b"], policy=GatePolicy()
    )


@pytest.mark.parametrize("passed", [True, False])
def test_the_gate_writes_its_verdict_as_json_and_rollout_reads_that_model(
    tmp_path: Path, passed: bool
) -> None:
    from evalsuite.gate_report import write_reports

    markdown, _ = write_reports(_verdict(passed), tmp_path / "gate")
    expected = "pass" if passed else "fail"
    verdict_file = tmp_path / "gate" / "verdict.json"
    assert json.loads(verdict_file.read_text())["passed"] is passed
    # The Markdown says the opposite: only the JSON model is read when it is there.
    markdown.write_text(f"# Release gate: {'FAIL' if passed else 'PASS'}\n")
    for path in (verdict_file, markdown, tmp_path / "gate"):
        assert read_gate_verdict(GateRequirement(path=path), None) == (expected, str(verdict_file))

    registry = FileRegistry(tmp_path / "registry")
    registry.publish(tmp_path / "gate", "gate-typed", "v1", kind="report")
    assert read_gate_verdict(GateRequirement(ref="gate-typed@v1"), registry) == (
        expected,
        "gate-typed@v1:verdict.json",
    )


def test_a_directory_without_a_verdict_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match=r"no verdict\.json"):
        read_gate_verdict(GateRequirement(path=tmp_path), None)


# ---------------------------------------------------------------------------------------------- analysis
def test_analysis_absolute_relative_and_no_data() -> None:
    thresholds = AnalysisThresholds.model_validate(
        {
            "error_rate": {"max": 0.02, "max_increase": 0.005},
            "p99_ttft_seconds": {"max_ratio": 1.2},
            "acceptance_rate": {"min": 0.4, "max_drop": 0.1},
        }
    )
    stable = WindowMetrics(
        requests=1000, errors=5, p99_ttft_seconds=1.0, drafted_tokens=100, accepted_tokens=70
    )
    good = WindowMetrics(requests=100, errors=1, p99_ttft_seconds=1.1, drafted_tokens=100, accepted_tokens=65)
    assert {c.status for c in evaluate_analysis(thresholds, good, stable)} == {"pass"}

    bad = WindowMetrics(requests=100, errors=3, p99_ttft_seconds=1.3, drafted_tokens=100, accepted_tokens=50)
    failed = {(c.metric, c.limit) for c in evaluate_analysis(thresholds, bad, stable) if c.status == "fail"}
    # 3% > 2% and 3% - 0.5% > 0.5%; 1.3 > 1.0 x 1.2; 0.5 is above 0.4 but 0.7 - 0.5 > 0.1
    assert failed == {
        ("error_rate", "max"),
        ("error_rate", "max_increase"),
        ("p99_ttft_seconds", "max_ratio"),
        ("acceptance_rate", "max_drop"),
    }

    alone = evaluate_analysis(thresholds, good, WindowMetrics())  # stable served nothing (weight 100)
    by_limit = {(c.metric, c.limit): c.status for c in alone}
    assert by_limit[("error_rate", "max")] == "pass"
    assert by_limit[("error_rate", "max_increase")] == "no_data"
    assert by_limit[("p99_ttft_seconds", "max_ratio")] == "no_data"
