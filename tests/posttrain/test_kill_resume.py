"""Chaos (issue 17): `tandem posttrain sft` SIGKILLed mid-run resumes from its last checkpoint.

A real SIGKILL of the command's process group (no handler, no ``finally``) once checkpoint-2 is sealed, while
step 3 runs; the same command line then resumes and finishes. Same seed, tiny model: the weights equal an
uninterrupted run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from posttrain.checkpoints import MANIFEST_NAME
from tests.conftest import REPO, sigkill_when

pytestmark = [pytest.mark.chaos, pytest.mark.chaos_full, pytest.mark.slow]


def _command(config: Path, base: Path, work_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cli.main",
        "posttrain",
        "sft",
        "--base",
        str(base),
        "--tasks",
        "documents",
        "--config",
        str(config),
        "--work-dir",
        str(work_dir),
    ]


def _run(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait(process: subprocess.Popen[bytes], log: Path, timeout_s: float = 600) -> None:
    try:
        code = process.wait(timeout=timeout_s)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert code == 0, log.read_text()[-3000:]


def test_sigkilled_sft_resumes_and_equals_an_uninterrupted_run(
    tiny_model_dir: Path, tmp_path: Path, chaos_report: Callable[..., object]
) -> None:
    config = tmp_path / "sft.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pool": {"families": ["documents"], "instances_per_family": 12},
                "train": {
                    "max_steps": 6,
                    "batch_size": 2,
                    "save_steps": 2,
                    "learning_rate": 1e-3,
                    "max_length": 640,  # documents prompts are 327-461 tokens
                    "seed": 7,
                },
                "evaluate_before_after": False,
                "output": {"publish": False},
            }
        )
    )
    log = tmp_path / "posttrain.log"
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    _wait(_run(_command(config, tiny_model_dir, straight_dir), log), log)

    process = _run(_command(config, tiny_model_dir, killed_dir), log)
    sigkill_when(process, killed_dir / "checkpoint-2" / MANIFEST_NAME, log)
    assert not (killed_dir / "candidate" / "model.safetensors").exists()  # it died before the end

    started = time.monotonic()
    _wait(_run(_command(config, tiny_model_dir, killed_dir), log), log)
    resumed_s = time.monotonic() - started
    assert "event=resume checkpoint=" in log.read_text() and "step=2" in log.read_text()

    straight = load_file(str(straight_dir / "candidate" / "model.safetensors"))
    resumed = load_file(str(killed_dir / "candidate" / "model.safetensors"))
    assert straight.keys() == resumed.keys()
    worst = max(float((straight[k] - resumed[k]).abs().max()) for k in straight)
    assert all(torch.allclose(straight[k], resumed[k], atol=1e-5) for k in straight), worst
    chaos_report(
        "SIGKILL of tandem posttrain sft after checkpoint-2 (step 3 running)",
        requests=6,
        failures=0,
        recovery_s=round(resumed_s, 1),
        detail=f"resumed from checkpoint-2; max |weight difference| vs uninterrupted = {worst:.1e}",
    )
