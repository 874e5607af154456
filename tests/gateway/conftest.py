"""Gateway fixtures: key stores on both backends (PostgreSQL from ``tests/conftest.py``'s session server),
and a second OpenAI-compatible server (vLLM's own) to stand behind the gateway as a litellm upstream."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import _private_dir, _tail, free_port

UPSTREAM_START_TIMEOUT_S = 600


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A key store URL on each backend (the PostgreSQL case skips when the server cannot run)."""
    if request.param == "sqlite":
        return str(tmp_path / "gateway.db")
    return str(request.getfixturevalue("postgres_database_url"))


@dataclass(frozen=True)
class OpenAIServer:
    """A running OpenAI-compatible server: ``base_url`` ends in /v1; requests need ``api_key``."""

    base_url: str
    model: str
    api_key: str
    log: Path


@pytest.fixture(scope="session")
def upstream_server() -> Iterator[OpenAIServer]:
    """vLLM's own OpenAI server (``vllm.entrypoints.openai.api_server``) on a free loopback port, serving a
    tiny random Llama in float32 behind an API key: a real second server for the gateway's upstreams.

    Set TANDEM_TEST_UPSTREAM_URL (its /v1 URL), TANDEM_TEST_UPSTREAM_MODEL and TANDEM_TEST_UPSTREAM_API_KEY
    to use a server that is already running.
    """
    if os.environ.get("TANDEM_TEST_UPSTREAM_URL"):
        yield OpenAIServer(
            os.environ["TANDEM_TEST_UPSTREAM_URL"].rstrip("/"),
            os.environ["TANDEM_TEST_UPSTREAM_MODEL"],
            os.environ["TANDEM_TEST_UPSTREAM_API_KEY"],
            Path("/dev/null"),
        )
        return
    from bench.tiny_model import build_tiny_llama

    work = _private_dir("upstream")
    model_dir = build_tiny_llama(work / "tiny-llama")
    port, api_key, name = free_port(), secrets.token_hex(16), "tiny-upstream"
    log = work / "vllm.log"
    # A small KV cache (GiB) and few threads: the machine's cores and memory are shared with the gateway.
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", name,
        "--host", "127.0.0.1", "--port", str(port), "--api-key", api_key,
        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "4", "--enforce-eager",
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM's OpenAI server exited with {process.returncode}:\n{_tail(log)}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > UPSTREAM_START_TIMEOUT_S:
                pytest.fail(
                    f"vLLM's OpenAI server not ready after {UPSTREAM_START_TIMEOUT_S}s:\n{_tail(log)}"
                )
            time.sleep(1)
        yield OpenAIServer(f"{base}/v1", name, api_key, log)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        # The engine-core child shares the server's process group: leave none of it behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
