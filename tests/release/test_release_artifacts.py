"""The release pipeline hands stages a typed ReleaseArtifacts model, merges what each produced, and resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from release import release as pipeline
from release.release import ReleaseArtifacts, ReleaseConfig, StageFailed, load_report, run_release


def test_stages_receive_and_return_the_typed_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, ReleaseArtifacts] = {}

    def posttrain(config: ReleaseConfig, artifacts: ReleaseArtifacts) -> ReleaseArtifacts:
        seen["posttrain"] = artifacts
        return ReleaseArtifacts(candidate="m@r1")

    def gate(config: ReleaseConfig, artifacts: ReleaseArtifacts) -> ReleaseArtifacts:
        seen["gate"] = artifacts
        return ReleaseArtifacts(
            gate_report=tmp_path / "gate-report.md", gate_verdict=tmp_path / "verdict.json"
        )

    def rollout(config: ReleaseConfig, artifacts: ReleaseArtifacts) -> ReleaseArtifacts:
        seen["rollout"] = artifacts
        raise StageFailed("rolled back")

    monkeypatch.setattr(pipeline, "STAGES", {"posttrain": posttrain, "gate": gate, "rollout": rollout})
    config = ReleaseConfig(base="m@base", work_dir=tmp_path, inputs=ReleaseArtifacts(draft="d@r0"))
    report = run_release(config)

    assert [r.status for r in report.stages] == ["passed", "passed", "failed"]
    assert seen["posttrain"] == ReleaseArtifacts(draft="d@r0")
    assert seen["rollout"].candidate == "m@r1" and seen["rollout"].draft == "d@r0"
    assert seen["rollout"].gate_verdict == tmp_path / "verdict.json"
    assert report.stages[0].artifacts == ReleaseArtifacts(candidate="m@r1")
    saved = load_report(tmp_path)
    assert saved is not None and saved.model_dump() == report.model_dump()

    # Resuming keeps the passed stages' artifacts and hands them on.
    seen.clear()
    again = run_release(config)
    assert set(seen) == {"rollout"} and seen["rollout"].candidate == "m@r1"
    assert again.artifacts.gate_report == tmp_path / "gate-report.md"


def test_unknown_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="candidat"):
        ReleaseConfig(base="m@base", inputs={"candidat": "m@v2"})  # type: ignore[arg-type]
