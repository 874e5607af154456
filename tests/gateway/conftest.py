"""Gateway fixtures: a throwaway PostgreSQL server (session-scoped) and key stores on both backends.

The PostgreSQL fixture runs ``initdb`` + ``pg_ctl`` in a temporary directory on a free loopback port (as
the ``postgres`` user when running as root, which initdb refuses) and skips when the binaries are absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(candidates[0]) if candidates else None


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server on loopback for this test session; yields a libpq URL."""
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) are not installed; see `make system-deps`")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed")
    # Not under pytest's tmp dir: that is private to root, and the server runs as 'postgres'.
    work = Path(tempfile.mkdtemp(prefix="tandem-pg-"))
    data, log = work / "data", work / "postgres.log"
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(work, "postgres")
        work.chmod(0o700)
    port = free_port()

    def run(*command: str) -> None:
        result = subprocess.run([*as_user, *command], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")

    run(initdb, "-D", str(data), "-U", "tandem", "--auth=trust", "-E", "UTF8", "--no-sync")
    run(
        pg_ctl,
        "-D",
        str(data),
        "-l",
        str(log),
        "-w",
        "-t",
        "60",
        "-o",
        f"-p {port} -k {work} -c listen_addresses=127.0.0.1 -c fsync=off",
        "start",
    )
    try:
        yield f"postgresql://tandem@127.0.0.1:{port}/postgres"
    finally:
        run(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def postgres_database_url(postgres_url: str) -> Iterator[str]:
    """A fresh database per test on the session's server."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    yield postgres_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A key store URL on each backend (the PostgreSQL case skips when the server cannot run)."""
    if request.param == "sqlite":
        return str(tmp_path / "gateway.db")
    return str(request.getfixturevalue("postgres_database_url"))
