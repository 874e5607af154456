"""Chaos (issue 17): the S3 registry's endpoint down at `tandem serve` start and during `tandem release`.

"Down" is a loopback port with nothing listening (connection refused), or a moto server the test SIGKILLs
in the middle of a release. Each command must exit non-zero within seconds, print one error line naming
the registry URL, its endpoint and the step the outage interrupted, and print no traceback; `tandem serve`
must fail before it starts Ray.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.conftest import REPO, _tail, free_port

pytestmark = pytest.mark.chaos

COMMAND_TIMEOUT_S = 90
BUCKET = "tandem-outage"
MARKER_ENV = "TANDEM_CHAOS_MARKER"


def _environment(tmp_path: Path, marker: str) -> dict[str, str]:
    """The child's environment: dummy credentials (no credential lookup), its own TANDEM_HOME and Ray temp
    dir (to tell whether Ray started), and a marker every descendant inherits (to find its leftovers)."""
    return os.environ | {
        "PYTHONPATH": str(REPO),
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "TANDEM_HOME": str(tmp_path / "home"),
        "RAY_TMPDIR": str(tmp_path / "raytmp"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "COLUMNS": "1000",  # rich wraps at 80 columns without a terminal: keep each message on its line
        MARKER_ENV: marker,
    }


def _run_tandem(
    args: list[str], env: dict[str, str], logs: Path
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``tandem <args>`` to its end, output to files (a leftover grandchild cannot hold a pipe open)."""
    started = time.monotonic()
    stdout, stderr = logs / f"{args[0]}.out", logs / f"{args[0]}.err"
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        process.wait(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stacks = _stacks(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        pytest.fail(f"tandem {args[0]} still running after {COMMAND_TIMEOUT_S} s:\n{_tail(stderr)}\n{stacks}")
    seconds = time.monotonic() - started
    return subprocess.CompletedProcess(
        process.args, process.returncode, stdout.read_text(), stderr.read_text()
    ), seconds


def _stacks(pid: int) -> str:
    """The Python stacks of a hung process, for the failure message (py-spy when installed)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        return ""
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    return dump.stdout + dump.stderr


def _error_line(output: str) -> str:
    lines = [
        line for line in output.splitlines() if line.startswith("error:") or "RegistryUnavailable" in line
    ]
    assert lines, output[-3000:]
    return lines[-1]


def _processes_with_marker(marker: str) -> list[str]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get(MARKER_ENV) == marker:
                found.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])[:120]}")
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
def test_serve_with_the_s3_endpoint_down_fails_before_ray(
    tmp_path: Path, chaos_report: Callable[..., Any]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    registry = f"s3://{BUCKET}/serve?endpoint_url={dead}"
    config = tmp_path / "tandem.yaml"
    config.write_text(
        yaml.safe_dump({"registry": registry, "server": {"host": "127.0.0.1", "port": free_port()}})
    )
    marker = uuid.uuid4().hex
    env = _environment(tmp_path, marker)

    result, seconds = _run_tandem(["serve", "--config", str(config)], env, tmp_path)
    output = result.stdout + result.stderr
    record = chaos_report(
        "S3 endpoint down (connection refused) at tandem serve start",
        requests=0,
        failures=0,
        detail=f"exit {result.returncode} in {seconds:.1f} s; {_error_line(output) if 'error:' in output else ''}",
        extra={"exit_code": result.returncode, "seconds": round(seconds, 1)},
    )

    assert result.returncode != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    line = _error_line(output)
    assert f"registry s3://{BUCKET}/serve (endpoint {dead}) is unreachable" in line
    # Every default tier serves the bundled model: preparing it in the registry is the first step.
    assert "while preparing the bundled model smollm2-135m-instruct@base in the registry" in line
    assert "reading the manifest of smollm2-135m-instruct@base" in line
    assert seconds < 60
    # Ray never started: no session under the child's Ray temp dir, nothing of the child's left running.
    assert not (tmp_path / "raytmp" / "ray").exists()
    assert _processes_with_marker(marker) == []
    record.extra["ray_started"] = "no"


def _publish(registry: Any, tmp_path: Path, name: str, version: str) -> None:
    src = tmp_path / f"{name}-{version}"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"name": name}))
    registry.publish(src, name, version, kind="model")


def _release_config(tmp_path: Path, registry: str, *, stages: list[str]) -> Path:
    """A release of ``tiny-candidate@r1`` over ``tiny@base``: eval with Inspect's mockllm named after the
    registry directories it fetched, a lenient gate, and a rollout whose /metrics never answers (so it rolls
    back within seconds and then publishes its report)."""
    rollout = tmp_path / "rollout.yaml"
    rollout.write_text(yaml.safe_dump({
        "name": "outage",
        "stable": {"model": "placeholder@v0"},
        "candidate": {"model": "placeholder@v1"},
        "gate": {"path": "unused.md"},
        "steps": [{"weight": 50}, {"weight": 100}],
        "rollback": {"max_metric_failures": 3, "drain_seconds": 2},
        "traffic": {"weights_file": str(tmp_path / "weights.json")},
        "metrics": {"urls": [f"http://127.0.0.1:{free_port()}/metrics"], "timeout_seconds": 1},
    }))  # fmt: skip
    policy = tmp_path / "gate.yaml"
    policy.write_text(yaml.safe_dump({
        "families": {"documents": {"margin": 0.05, "min_samples": 3}},
        "parity": {"required": False},
        "bootstrap_resamples": 200,
    }))  # fmt: skip
    config = tmp_path / "release.yaml"
    config.write_text(yaml.safe_dump({
        "base": "tiny@base",
        "registry": registry,
        "release_id": "r1",
        "work_dir": str(tmp_path / "work"),
        "stages": stages,
        "inputs": {"candidate": "tiny-candidate@r1"},
        "eval": {
            "candidate_models": ["mockllm/{candidate_dir}"],
            "baseline_models": ["mockllm/{base_dir}"],
            "families": ["documents"],
            "limit": 3,
            "max_tokens": 16,
        },
        "gate": {"policy": str(policy)},
        "rollout": {"config": str(rollout), "poll_interval": 0.5},
    }))  # fmt: skip
    return config


def _stopped_at(output: str) -> str:
    match = re.search(r"release stopped at (\w+): (.*)", output)
    assert match, output[-3000:]
    return match.group(0)


def test_release_with_the_s3_endpoint_down_fails_at_its_first_registry_step(
    tmp_path: Path, chaos_report: Callable[..., Any]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    registry = f"s3://{BUCKET}/release?endpoint_url={dead}"
    config = _release_config(tmp_path, registry, stages=["eval"])
    env = _environment(tmp_path, uuid.uuid4().hex)

    result, seconds = _run_tandem(["release", "--base", "tiny@base", "--config", str(config)], env, tmp_path)
    output = result.stdout + result.stderr
    stopped = _stopped_at(result.stdout) if "release stopped" in result.stdout else ""
    chaos_report(
        "S3 endpoint down (connection refused) at tandem release's first registry step",
        requests=0,
        failures=0,
        detail=f"exit {result.returncode} in {seconds:.1f} s; {stopped}",
        extra={"exit_code": result.returncode, "seconds": round(seconds, 1)},
    )

    assert result.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert stopped.startswith("release stopped at eval: RegistryUnavailable:")
    assert f"registry s3://{BUCKET}/release (endpoint {dead}) is unreachable" in stopped
    assert (
        "while fetching the candidate tiny-candidate@r1 for the eval model mockllm/{candidate_dir}" in stopped
    )
    assert seconds < 60


@pytest.fixture()
def moto_endpoint(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A moto S3 server of this test's own (the session's ``s3_endpoint`` must outlive this test's kill)."""
    port = free_port()
    log = tmp_path / "moto.log"
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    with log.open("w") as out:
        process = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"moto_server did not start:\n{_tail(log)}")
            time.sleep(0.2)
    yield url, process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


def _wait_for_audit(audit: Path, decision: str, process: subprocess.Popen[str], timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if audit.is_file() and any(
            json.loads(line).get("decision") == decision for line in audit.read_text().splitlines() if line
        ):
            return time.monotonic()
        assert process.poll() is None, "tandem release ended before its rollout started"
        time.sleep(0.05)
    pytest.fail(f"no {decision!r} in {audit} after {timeout_s} s")


@pytest.mark.integration
def test_s3_killed_mid_release_fails_the_report_publish(
    tmp_path: Path,
    moto_endpoint: tuple[str, subprocess.Popen[bytes]],
    chaos_report: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3

    from infra.registry import open_registry

    endpoint, moto = moto_endpoint
    env = _environment(tmp_path, uuid.uuid4().hex)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(key, env[key])
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    registry_url = f"s3://{BUCKET}/release?endpoint_url={endpoint}"
    registry = open_registry(registry_url)
    _publish(registry, tmp_path, "tiny", "base")
    _publish(registry, tmp_path, "tiny-candidate", "r1")
    config = _release_config(tmp_path, registry_url, stages=["eval", "gate", "rollout"])

    started = time.monotonic()
    release = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "release", "--base", "tiny@base", "--config", str(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Eval fetched both models from S3 and the gate passed: the rollout is running. Kill S3 now.
        _wait_for_audit(tmp_path / "work" / "rollout" / "audit.jsonl", "gate_passed", release, 60)
        moto.send_signal(signal.SIGKILL)
        moto.wait(timeout=10)
        killed = time.monotonic()
        out, err = release.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if release.poll() is None:
            release.kill()
    ended = time.monotonic()
    output = out + err
    stopped = _stopped_at(out) if "release stopped" in out else ""
    chaos_report(
        "S3 endpoint SIGKILLed mid-release (after eval's fetches, during the rollout)",
        requests=0,
        failures=0,
        detail=f"exit {release.returncode} {ended - killed:.1f} s after the kill; {stopped}",
        extra={
            "exit_code": release.returncode if release.returncode is not None else -1,
            "seconds_total": round(ended - started, 1),
            "seconds_after_kill": round(ended - killed, 1),
        },
    )

    assert release.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    statuses = json.loads((tmp_path / "work" / "release.json").read_text())["stages"]
    assert [s["status"] for s in statuses] == ["skipped", "skipped", "passed", "passed", "failed"]
    assert stopped.startswith("release stopped at rollout: RegistryUnavailable:")
    assert f"registry s3://{BUCKET}/release (endpoint {endpoint}) is unreachable" in stopped
    assert "while publishing the rollout report rollout-outage-r1@" in stopped
    assert ended - killed < 60
