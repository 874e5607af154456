"""Session-scoped fixtures that start real servers: a local S3 (moto), PostgreSQL and the full gateway
(Ray + vLLM).

Each server starts once per test session and only when a test asks for it, so the unit tests stay fast.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
GATEWAY_START_TIMEOUT_S = 900
CHAOS_REPORT_ENV = "TANDEM_CHAOS_REPORT"


@dataclass
class ChaosRecord:
    """One fault-injection scenario's figures, for the chaos report (``make chaos`` writes it as JSON).

    ``requests`` were sent while the fault was in force; ``clean_errors`` of them got the documented error
    (a 503 with Retry-After, a named refusal), ``failures`` anything else (a 500, a hang, a lost result): every
    scenario asserts that count. ``recovery_s`` is the time from the fault's end to the first good answer.
    """

    scenario: str
    fault: str
    requests: int = 0
    clean_errors: int = 0
    failures: int = 0
    recovery_s: float | None = None
    detail: str = ""
    passed: bool | None = None
    extra: dict[str, float | int | str] = field(default_factory=dict)


_CHAOS_RECORDS: list[ChaosRecord] = []


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> Callable[..., ChaosRecord]:
    """``chaos_report(fault, requests=..., failures=..., ...)`` records this scenario for the chaos report;
    whether the test passed is filled in when it ends."""

    def record(fault: str, **figures: object) -> ChaosRecord:
        entry = ChaosRecord(scenario=request.node.nodeid, fault=fault, **figures)  # type: ignore[arg-type]
        _CHAOS_RECORDS.append(entry)
        request.node.stash.setdefault(_CHAOS_KEY, []).append(entry)
        return entry

    return record


_CHAOS_KEY = pytest.StashKey[list[ChaosRecord]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``chaos_full`` scenarios and ``e2e_full`` runs run only when ``-m`` names a marker (``make chaos``,
    ``make test-e2e``): the suite of ``make test`` stays under its time limit, and the skip reason says where
    they run."""
    if config.getoption("markexpr"):
        return
    skips = {
        "chaos_full": pytest.mark.skip(reason="chaos_full: run by make chaos"),
        "e2e_full": pytest.mark.skip(reason="e2e_full: run by make test-e2e"),
    }
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker):
                item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or report.failed:
        for entry in item.stash.get(_CHAOS_KEY, []):
            entry.passed = report.passed if entry.passed in (None, True) else False


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With $TANDEM_CHAOS_REPORT set (``make chaos`` sets it), write the recorded scenarios there as JSON."""
    path = os.environ.get(CHAOS_REPORT_ENV)
    if not path or not _CHAOS_RECORDS:
        return
    report = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scenarios": [asdict(entry) for entry in _CHAOS_RECORDS],
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2) + "\n")


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


def sigkill_when(process: subprocess.Popen[bytes], marker: Path, log: Path, timeout_s: float = 600) -> None:
    """SIGKILL ``process``'s group once ``marker`` exists (a checkpoint sealed): no handler or ``finally`` runs.
    Fails with the log's tail if the process ends first or ``marker`` does not appear in ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    try:
        while not marker.is_file():
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL


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


# -- PostgreSQL -------------------------------------------------------------------------------------
def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(candidates[0]) if candidates else None


@dataclass
class PostgresServer:
    """A throwaway PostgreSQL server on a loopback port; ``stop()`` and ``start()`` keep its data and port,
    so fault-injection tests can take it down and bring it back under the same URL."""

    url: str
    data: Path
    log: Path
    pg_ctl: str
    options: str
    as_user: list[str]

    def _pg_ctl(self, *arguments: str) -> None:
        command = [*self.as_user, self.pg_ctl, "-D", str(self.data), *arguments]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}\n{_tail(self.log)}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._pg_ctl("-l", str(self.log), "-w", "-t", "60", "-o", self.options, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: abort open transactions, disconnect clients) and wait until it is down."""
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for this test session: ``initdb`` + ``pg_ctl`` in a temporary directory (as the
    ``postgres`` user when running as root, which initdb refuses); skips when the binaries are absent."""
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) are not installed; see `make system-deps`")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed")
    # Not under pytest's tmp dir: that is private to root, and the server runs as 'postgres'.
    work = Path(tempfile.mkdtemp(prefix="tandem-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(work, "postgres")
        work.chmod(0o700)
    port = free_port()
    server = PostgresServer(
        url=f"postgresql://tandem@127.0.0.1:{port}/postgres",
        data=work / "data",
        log=work / "postgres.log",
        pg_ctl=pg_ctl,
        options=f"-p {port} -k {work} -c listen_addresses=127.0.0.1 -c fsync=off",
        as_user=as_user,
    )
    initialised = subprocess.run(
        [*as_user, initdb, "-D", str(server.data), "-U", "tandem", "--auth=trust", "-E", "UTF8", "--no-sync"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if initialised.returncode != 0:
        pytest.fail(f"initdb failed:\n{initialised.stdout}\n{initialised.stderr}")
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """The session's PostgreSQL server as a libpq URL (its ``postgres`` database)."""
    return postgres_server.url


@pytest.fixture
def postgres_database_url(postgres_url: str) -> str:
    """A fresh database per test on the session's server."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"
