"""``tandem release`` end to end on tiny models: real posttrain, distill, eval (Inspect mockllm), gate and
rollout controller; the pipeline stops at the first failing stage and a rerun resumes after the passed ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from bench.tiny_model import build_tiny_llama
from cli.main import app
from infra.registry import FileRegistry
from release.release import STAGES, ReleaseConfig, load_report, run_release

pytestmark = pytest.mark.slow


def _gate_policy(path: Path, min_samples: int) -> Path:
    path.write_text(yaml.safe_dump({
        "families": {"documents": {"margin": 0.05, "min_samples": min_samples}},
        "parity": {"required": False},
        "bootstrap_resamples": 200,
    }))  # fmt: skip
    return path


def _rollout_template(path: Path, dead_port: int) -> Path:
    # Nothing serves /metrics at this port: the controller must roll back after the metric failures.
    path.write_text(yaml.safe_dump({
        "name": "tiny",
        "stable": {"model": "placeholder@v0"},
        "candidate": {"model": "placeholder@v1"},
        "gate": {"path": "unused.md"},
        "steps": [{"weight": 50}, {"weight": 100}],
        "rollback": {"max_metric_failures": 1, "drain_seconds": 0},
        "traffic": {"weights_file": str(path.parent / "weights.json")},
        "metrics": {"urls": [f"http://127.0.0.1:{dead_port}/metrics"], "timeout_seconds": 1},
    }))  # fmt: skip
    return path


@pytest.fixture()
def release_settings(tmp_path: Path) -> dict[str, Any]:
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(build_tiny_llama(tmp_path / "tiny", layers=2, hidden=64), "tiny", "base", kind="model")
    return {
        "base": "tiny@base",
        "registry": f"file://{tmp_path / 'registry'}",
        "release_id": "r1",
        "work_dir": str(tmp_path / "work"),
        "posttrain": {"settings": {
            "pool": {"families": ["documents"], "instances_per_family": 4},
            "train": {"max_steps": 2, "batch_size": 1, "save_steps": 2, "max_length": 1024},
            "evaluate_before_after": False,
            "output": {"candidate_name": "tiny-candidate"},
        }},
        "distill": {"method": "layer-subset", "settings": {
            "keep_layers": [0], "steps": 2, "batch_size": 2, "max_new_tokens": 8, "max_prompt_tokens": 32,
            "divergence": "fkl", "eval_every": 2, "eval_prompts": 2, "eval_new_tokens": 8,
            "checkpoint_every": 2, "compute_dtype": "float32", "cost_ratio": 0.25, "threads": 1,
        }},
        "eval": {
            "candidate_models": ["mockllm/model"],
            "baseline_models": ["mockllm/model"],
            "families": ["documents"],
            "limit": 3,
            "max_tokens": 16,
        },
        "gate": {"policy": str(_gate_policy(tmp_path / "gate-strict.yaml", min_samples=30))},
        "rollout": {"config": str(_rollout_template(tmp_path / "rollout.yaml", dead_port=9)), "poll_interval": 0.1},
    }  # fmt: skip


def test_release_stops_at_the_gate_then_resumes_and_stops_at_the_rollout(
    release_settings: dict[str, Any], tmp_path: Path
) -> None:
    config = ReleaseConfig.model_validate(release_settings)
    first = run_release(config)

    assert [record.stage for record in first.stages] == list(STAGES) == [
        "posttrain", "distill", "eval", "gate", "rollout",
    ]  # fmt: skip
    assert [record.status for record in first.stages] == ["passed", "passed", "passed", "failed", "not_run"]
    by_stage = {record.stage: record for record in first.stages}
    assert by_stage["posttrain"].artifacts.candidate == "tiny-candidate@r1"
    assert by_stage["distill"].artifacts.draft == "tiny-candidate-draft@r1"
    registry = FileRegistry(tmp_path / "registry")
    assert registry.manifest("tiny-candidate-draft@r1").lineage.parents == ["tiny-candidate@r1"]
    assert first.failed_stage is not None and first.failed_stage.stage == "gate"
    assert (
        "gate FAIL" in first.failed_stage.detail
        and "3 paired samples < minimum 30" in first.failed_stage.detail
    )
    assert by_stage["rollout"].detail == "an earlier stage failed"
    assert all(by_stage[s].seconds is not None for s in ("posttrain", "distill", "eval", "gate"))
    saved = load_report(config.work_dir)
    assert saved is not None and saved.model_dump() == first.model_dump()

    # Loosen the gate and rerun through the CLI: passed stages are kept, the gate passes, and the rollout
    # controller (no metrics reachable) rolls the candidate back, which stops the release there.
    settings = release_settings | {
        "gate": {"policy": str(_gate_policy(tmp_path / "gate.yaml", min_samples=3))}
    }
    config_path = tmp_path / "release.yaml"
    config_path.write_text(yaml.safe_dump(settings))
    result = CliRunner().invoke(app, ["release", "--base", "tiny@base", "--config", str(config_path)])
    assert result.exit_code == 1, result.output
    assert "release stopped at rollout" in result.output
    second = load_report(config.work_dir)
    assert second is not None
    assert [record.status for record in second.stages] == ["passed"] * 4 + ["failed"]
    for stage in ("posttrain", "distill", "eval"):
        kept = {r.stage: r for r in second.stages}[stage]
        assert kept.detail == "passed in an earlier run; not run again"
        assert kept.seconds == by_stage[stage].seconds
    rollout = second.stages[-1]
    assert "rollout ended rolled_back" in rollout.detail and "consecutive metric failures" in rollout.detail
    audit = [
        json.loads(line) for line in (config.work_dir / "rollout" / "audit.jsonl").read_text().splitlines()
    ]
    gate_record = next(record for record in audit if record["decision"] == "gate_passed")
    assert gate_record["gate"]["source"].endswith(
        "verdict.json"
    )  # the gate's typed verdict, not its Markdown
    assert audit[-1]["decision"] == "finished"


def test_release_with_unknown_stage_names_is_refused(release_settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="stages"):
        ReleaseConfig.model_validate(release_settings | {"stages": ["posttrain", "deploy"]})
