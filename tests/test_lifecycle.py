"""Stop signals (issue 17): SIGTERM and Ctrl-C end a command cleanly, a second signal forces the exit, and
Ray's own SIGTERM handler (a stack dump and an abort) never takes over.

The unit tests run a small Python child under ``infra.lifecycle``; the integration test stops a real
``tandem serve`` (the bundled model, one tier, its own Ray) with SIGTERM in the middle of a stream.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.conftest import REPO, _tail, free_port, wait_until_serving

pytestmark = pytest.mark.chaos

CHILD = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    from infra import lifecycle

    lifecycle.install()
    if "--ray" in sys.argv:
        lifecycle.init_ray(num_cpus=1, include_dashboard=False, log_to_driver=False)
    # The helper gets none of our pipes: if this child ever died without its clean-up, the test's
    # communicate() must see EOF instead of waiting on the orphaned helper.
    helper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        # "ready" inside the try: the test signals as soon as it reads it, and under CI load the signal
        # once arrived before the try was entered (Stop escaped as a traceback).
        print("ready", helper.pid, flush=True)
        threading.Event().wait()
    except lifecycle.Stop as stop:
        print("stopping", stop.name, flush=True)
        if "--slow-cleanup" in sys.argv:
            time.sleep(60)
        helper.terminate()
        helper.wait()
        if "--ray" in sys.argv:
            import ray
            ray.shutdown()
        print("stopped", flush=True)
        sys.exit(stop.exit_code)
    """
)


def _start_child(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[str], int]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), *flags],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("ready"), line + (child.stderr.read() if child.stderr else "")
    return child, int(line.split()[1])


def _gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still running after ``timeout_s`` (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _commands(pids: list[int]) -> list[str]:
    names = []
    for pid in pids:
        try:
            names.append(" ".join(psutil.Process(pid).cmdline())[:120])
        except psutil.NoSuchProcess:
            pass
    return names


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_unwinds_through_the_commands_cleanup(tmp_path: Path, signum: int, code: int) -> None:
    child, _ = _start_child(tmp_path)
    child.send_signal(signum)
    out, err = child.communicate(timeout=30)
    assert child.returncode == code, err
    assert out.splitlines() == [f"stopping {signal.Signals(signum).name}", "stopped"]
    assert "Traceback" not in err


def test_a_second_signal_forces_the_exit_and_kills_what_the_process_started(tmp_path: Path) -> None:
    child, helper = _start_child(tmp_path, "--slow-cleanup")
    child.send_signal(signal.SIGTERM)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "stopping SIGTERM"  # in the 60 s clean-up now
    started = time.monotonic()
    child.send_signal(signal.SIGINT)
    child.wait(timeout=30)
    assert time.monotonic() - started < 10
    assert child.returncode == 130
    assert child.stderr is not None and "second SIGINT: stopping now" in child.stderr.read()
    assert _gone([helper], 5) == []


@pytest.mark.integration
def test_ray_does_not_take_sigterm_over(tmp_path: Path) -> None:
    """Connected to Ray, SIGTERM still unwinds (no `*** SIGTERM received` stack dump and abort), and
    ray.shutdown in the clean-up leaves none of the node's processes behind."""
    child, _ = _start_child(tmp_path, "--ray")
    started_by_child = [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
    assert len(started_by_child) > 2  # the helper, and Ray's GCS, raylet, agents...
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 143, err[-3000:]
    assert out.splitlines()[-1] == "stopped"
    assert "SIGTERM received" not in err and "Traceback" not in err
    assert _gone(started_by_child, 15) == []


@pytest.mark.integration
@pytest.mark.slow
def test_sigterm_ends_tandem_serve_mid_stream_cleanly(
    tmp_path: Path, chaos_report: Callable[..., object]
) -> None:
    """SIGTERM with a stream in flight: the stream ends (completed or closed, never hung), `tandem serve`
    exits 0 within 15 s without a stack trace, and no process it started (Ray's node, the engine) is left."""
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"lc-{os.getpid()}"  # short: Ray's socket paths
    work.mkdir(exist_ok=True)
    port = free_port()
    config = {
        "registry": f"file://{tmp_path / 'registry'}",
        "engine": {"max_model_len": 1024, "max_num_seqs": 4, "extra": {"kv_cache_memory_bytes": 128 * 2**20}},
        "tiers": [{"name": "standard", "model_id": "tandem-standard", "aliases": ["standard"]}],
        "server": {"host": "127.0.0.1", "port": port},
        "gateway": {"auth": {"mode": "none"}},
        "ray": {"num_cpus": 4},
    }
    config_path = tmp_path / "tandem.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--config", str(config_path)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": str(work)},
        )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(serve, base_url, log, 600)
        started_by_serve = [p.pid for p in psutil.Process(serve.pid).children(recursive=True)]

        chunks: list[str] = []
        ended = threading.Event()
        first = threading.Event()

        def stream() -> None:
            body = {
                "model": "tandem-standard",
                "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
                "max_tokens": 400,
                "stream": True,
            }
            try:
                with httpx.stream(
                    "POST", f"{base_url}/v1/chat/completions", json=body, timeout=60
                ) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            chunks.append(line[6:])
                            first.set()
            except httpx.HTTPError as exc:  # the server closed the stream: a clean end for this test
                chunks.append(f"closed: {type(exc).__name__}")
            finally:
                first.set()
                ended.set()

        threading.Thread(target=stream, daemon=True).start()
        assert first.wait(120), _tail(log)
        signalled = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        stopped_in = time.monotonic() - signalled
        assert ended.wait(15), "the in-flight stream hung after the server stopped"
        text = log.read_text()
        assert serve.returncode == 0, _tail(log)
        assert stopped_in < 15, f"tandem serve took {stopped_in:.1f}s to stop:\n{_tail(log)}"
        assert "Traceback" not in text and "SIGTERM received" not in text, _tail(log)
        assert "stopped (SIGTERM)" in text
        assert _gone(started_by_serve, 15) == [], _commands(_gone(started_by_serve, 0))
        assert chunks and chunks[0] != "[DONE]"
        json.loads(chunks[0])  # the stream had begun with a real chunk
        chaos_report(
            "SIGTERM to tandem serve with a stream in flight",
            requests=1,
            failures=0,
            recovery_s=round(stopped_in, 1),
            detail=f"exit 0 in {stopped_in:.1f} s (limit 15); stream {'completed' if chunks[-1] == '[DONE]' else 'closed'}"
            f"; {len(started_by_serve)} started processes, none left",
        )
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(work)], check=False)
