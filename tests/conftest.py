"""Session-scoped fixtures that start real servers: a local S3 (moto) and the full gateway (Ray + vLLM).

Each server starts once per test session and only when a test asks for it, so the unit tests stay fast.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
GATEWAY_START_TIMEOUT_S = 900


def _private_dir(name: str) -> Path:
    """A directory outside pytest's basetemp, which a concurrent pytest run may rotate away mid-session."""
    path = Path(tempfile.mkdtemp(prefix=f"tandem-tests-{name}-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3-compatible HTTP server (moto) on loopback; yields its endpoint URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    env = os.environ | {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    with log.open("w") as out:
        process = subprocess.Popen(
            [server, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out, env=env
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            if process.poll() is not None:
                pytest.fail(f"moto_server exited early:\n{_tail(log)}")
            time.sleep(0.2)
    else:
        process.kill()
        pytest.fail(f"moto_server did not start:\n{_tail(log)}")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    yield url
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="session")
def bundled_model_dir() -> Path:
    """The bundled model as safetensors (converted once per machine, verified every time)."""
    from infra.bundled import prepare_bundled_model

    return prepare_bundled_model()


@dataclass
class Gateway:
    base_url: str
    log: Path
    api_key: str
    key_store: str

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def _suite_key(key_store: str) -> str:
    """A key for the test suite itself, with limits no test reaches."""
    from gateway.keys import open_key_store

    store = open_key_store(key_store)
    try:
        return store.create(
            "test-suite", "tests", requests_per_minute=1_000_000, tokens_per_minute=1_000_000_000
        ).key
    finally:
        store.close()


def wait_until_serving(
    process: subprocess.Popen[bytes] | subprocess.Popen[str], base_url: str, log: Path, timeout_s: float
) -> None:
    """Poll ``/health`` until it answers 200. Fails with the log's tail when ``process`` exits first, or when
    ``timeout_s`` passes (its process group is killed then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            pytest.fail(f"tandem serve exited with {process.returncode}:\n{_tail(log)}")
        try:
            if httpx.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"tandem serve not ready after {timeout_s}s:\n{_tail(log)}")
        time.sleep(1)


@pytest.fixture(scope="session")
def gateway(bundled_model_dir: Path) -> Iterator[Gateway]:
    """`tandem serve` in a subprocess, float32, with the fast tier speculating with the EAGLE-3 head shipped
    for the bundled model (published to the fresh registry beside it, as on a fresh clone).

    Float32 because the lossless test compares token ids: the fast tier must reproduce the standard
    tier exactly, and float32 leaves no room for batch-shape rounding differences.
    Set TANDEM_TEST_GATEWAY_URL to run the tests against a gateway that is already running.
    """
    if os.environ.get("TANDEM_TEST_GATEWAY_URL"):
        yield Gateway(
            base_url=os.environ["TANDEM_TEST_GATEWAY_URL"].rstrip("/"),
            log=Path("/dev/null"),
            api_key=os.environ["TANDEM_TEST_API_KEY"],
            key_store=os.environ["TANDEM_TEST_KEY_STORE"],
        )
        return
    work = _private_dir("gateway")
    port = free_port()
    key_store = str(work / "keys.db")
    api_key = _suite_key(key_store)
    config = {
        "registry": f"file://{work / 'registry'}",
        "engine": {
            "dtype": "float32",
            "max_model_len": 2048,
            "gpu_memory_utilization": 0.12,
            "max_num_seqs": 16,
        },
        "tiers": [
            {"name": "standard", "model_id": "tandem-standard", "aliases": ["standard"]},
            {
                "name": "fast",
                "model_id": "tandem-fast",
                "aliases": ["fast"],
                # eagle3, not auto: a missing head fails the start instead of falling back to n-gram.
                "speculative": {"method": "eagle3", "num_speculative_tokens": 3},
            },
        ],
        "server": {"host": "127.0.0.1", "port": port},
        # Spill thresholds off: the tests assert which tier answered (spill itself is unit-tested).
        "gateway": {
            "auth": {"mode": "keys", "key_store": key_store},
            "routing": {"spill_ttft_s": None, "spill_tpot_s": None, "spill_max_in_flight": 1000},
        },
    }
    config_path = work / "tandem.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = work / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--config", str(config_path)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    wait_until_serving(process, base_url, log, GATEWAY_START_TIMEOUT_S)
    yield Gateway(base_url=base_url, log=log, api_key=api_key, key_store=key_store)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
