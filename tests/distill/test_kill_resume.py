"""Chaos (issue 17): `tandem distill` SIGKILLed mid-run resumes from its last checkpoint.

A real SIGKILL of the command's process group once the step-2 checkpoint is on disk (step 3 running); the
same command line then resumes and finishes. Same seed, tiny teacher: every step's loss and the final draft
weights equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from infra.registry import FileRegistry
from tests.conftest import REPO, sigkill_when

pytestmark = [pytest.mark.chaos, pytest.mark.chaos_full, pytest.mark.slow]

SETTINGS = {
    "keep_layers": [0, 3],
    "steps": 6,
    "batch_size": 4,
    "max_new_tokens": 12,
    "max_prompt_tokens": 32,
    "divergence": "fkl",
    "learning_rate": 1e-2,
    "warmup_steps": 2,
    "eval_every": 6,
    "eval_prompts": 4,
    "eval_new_tokens": 12,
    "checkpoint_every": 2,
    "compute_dtype": "float32",
    "cost_ratio": 0.25,
    "threads": 1,
    "publish": False,
}


def _start(config: Path, registry: FileRegistry, work_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "cli.main",
        "distill",
        "--teacher",
        "tiny-teacher@v1",
        "--method",
        "layer-subset",
        "--config",
        str(config),
        "--registry",
        f"file://{registry.root}",
        "--work-dir",
        str(work_dir),
    ]
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _finish(process: subprocess.Popen[bytes], log: Path) -> None:
    try:
        code = process.wait(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert code == 0, log.read_text()[-3000:]


def _state(work_dir: Path) -> dict[str, Any]:
    return dict(torch.load(work_dir / "main" / "checkpoint.pt", weights_only=False))


def test_sigkilled_distill_resumes_and_equals_an_uninterrupted_run(
    tiny_teacher_registry: FileRegistry, tmp_path: Path, chaos_report: Callable[..., object]
) -> None:
    config = tmp_path / "distill.yaml"
    config.write_text(yaml.safe_dump(SETTINGS))
    log = tmp_path / "distill.log"
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    _finish(_start(config, tiny_teacher_registry, straight_dir, log), log)

    process = _start(config, tiny_teacher_registry, killed_dir, log)
    sigkill_when(process, killed_dir / "main" / "checkpoint.pt", log)
    killed_at = int(_state(killed_dir)["step"])
    assert killed_at < SETTINGS["steps"], "the run ended before the kill"

    started = time.monotonic()
    _finish(_start(config, tiny_teacher_registry, killed_dir, log), log)
    resumed_s = time.monotonic() - started
    assert f"resumed at step {killed_at}" in log.read_text()

    straight, resumed = _state(straight_dir), _state(killed_dir)
    straight_losses = [loss for _, loss in straight["history"]["losses"]]
    resumed_losses = [loss for _, loss in resumed["history"]["losses"]]
    assert [int(s) for s, _ in resumed["history"]["losses"]] == list(range(1, 7))
    assert resumed_losses == pytest.approx(straight_losses, rel=1e-4)
    worst = max(float((straight["draft"][k] - resumed["draft"][k]).abs().max()) for k in straight["draft"])
    assert worst < 1e-4, worst
    chaos_report(
        f"SIGKILL of tandem distill (layer-subset) after the step-{killed_at} checkpoint",
        requests=SETTINGS["steps"],
        failures=0,
        recovery_s=round(resumed_s, 1),
        detail=f"losses equal the uninterrupted run's (rel 1e-4); max |weight difference| {worst:.1e}; "
        + json.dumps({"killed_at_step": killed_at}),
    )
