"""A post-training algorithm from a third-party package (a run config + trainer pair registered through the
``tandem.posttrain_algorithms`` entry point) gets its ``tandem posttrain`` command, its
``posttrain.posttrain_<name>`` trainer and a place in the release pipeline, with no edit to Tandem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ECHO = '''
    from posttrain.algorithms import posttrain_algorithm
    from posttrain.config import RunConfig
    from posttrain.run import CandidateResult


    @posttrain_algorithm("echo", trainer="tandem_echo:train_echo")
    class EchoRunConfig(RunConfig):
        """Echo: hands the base back as the candidate (a stand-in for a real algorithm)."""

        note: str = "unchanged"


    def train_echo(config: EchoRunConfig, resume: bool = True) -> CandidateResult:
        return CandidateResult(stage="echo", model_dir=config.base, run_dir="-",
                               metrics={"steps": config.train.max_steps, "families": config.pool.families})
'''

PROBE = """
import json, sys
from typer.testing import CliRunner

import posttrain
from posttrain.cli import posttrain_app
from release.release import PosttrainStage

runner = CliRunner()
listing = runner.invoke(posttrain_app, ["--help"]).output
run = runner.invoke(posttrain_app, ["echo", "--base", "m@v", "--steps", "7", "--tasks", "documents"])
print(json.dumps({
    "algorithms": posttrain.algorithm_names(),
    "listed": "echo" in listing and "Echo: hands the base back" in listing,
    "exit_code": run.exit_code,
    "output": run.output,
    "trainer": posttrain.posttrain_echo.__module__,
    "release_method": PosttrainStage(method="echo").method,
    "heavy": "torch" in sys.modules or "trl" in sys.modules,
}))
"""


def test_a_third_party_algorithm_gets_a_command_a_trainer_and_a_release_method(tmp_path: Path) -> None:
    (tmp_path / "tandem_echo.py").write_text(textwrap.dedent(ECHO))
    dist_info = tmp_path / "tandem_echo-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tandem-echo\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[tandem.posttrain_algorithms]\necho = tandem_echo\n")
    repo = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)]), "COLUMNS": "200"}
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=repo)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["algorithms"] == ["sft", "rl", "dpo", "echo"]
    assert seen["listed"]
    assert seen["exit_code"] == 0, seen["output"]
    assert "steps" in seen["output"] and "7" in seen["output"] and "['documents']" in seen["output"]
    assert seen["trainer"] == "tandem_echo"
    assert seen["release_method"] == "echo"
    assert not seen["heavy"]  # listing and running a light algorithm loads no torch or trl

    # Without the package the algorithm is unknown, so the probe above could fail.
    bare = subprocess.run(
        [sys.executable, "-c", "import posttrain; print(posttrain.algorithm_names())"],
        capture_output=True, text=True, cwd=repo,
    )  # fmt: skip
    assert bare.stdout.strip() == "('sft', 'rl', 'dpo')"
