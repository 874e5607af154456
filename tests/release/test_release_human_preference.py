"""`tandem release`'s gate stage passes the blind-review summary to the gate, as `tandem gate
--human-preference` does, so a policy that requires the human-preference row can pass a release."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evalsuite import runner as eval_runner
from release.release import ReleaseArtifacts, ReleaseConfig, StageFailed, run_gate_stage
from tests.evalsuite.test_gate_human_preference import INFERIOR, OUTCOMES, PREFERRED, policy


def gate_config(tmp_path: Path, preference: Path | None) -> ReleaseConfig:
    policy_file = tmp_path / "gate.yaml"
    policy_file.write_text(yaml.safe_dump(policy(required=True).model_dump(mode="json")))
    gate = {"policy": str(policy_file)} | ({"human_preference": str(preference)} if preference else {})
    return ReleaseConfig.model_validate(
        {"base": "tiny@base", "work_dir": str(tmp_path / "work"), "gate": gate}
    )


def test_the_gate_stage_reads_the_human_preference_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eval_runner, "read_outcomes", lambda path: OUTCOMES)
    logs = ReleaseArtifacts(candidate_logs=tmp_path, baseline_logs=tmp_path)
    preferred, inferior = tmp_path / "preferred.json", tmp_path / "inferior.json"
    preferred.write_text(PREFERRED.model_dump_json())
    inferior.write_text(INFERIOR.model_dump_json())

    passed = run_gate_stage(gate_config(tmp_path, preferred), logs)
    assert (
        passed.gate_report is not None and "human preference [support-w49]" in passed.gate_report.read_text()
    )
    with pytest.raises(StageFailed, match="human preference"):
        run_gate_stage(gate_config(tmp_path, inferior), logs)
    with pytest.raises(StageFailed, match="human preference"):
        run_gate_stage(gate_config(tmp_path, None), logs)  # required by the policy, no file given
