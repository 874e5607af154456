"""Chaos (issue 17): a registry publish SIGKILLed at every stage, on file:// and on S3 (moto).

The child process kills itself with SIGKILL at a chosen point of ``publish`` (before the n-th file is
copied or uploaded, before the manifest is written, before the staged directory is renamed into place):
a real SIGKILL, so no ``finally`` runs. Afterwards no partial version is listed or fetchable, and the next
publish of the same version succeeds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.errors import ArtifactNotFound, IntegrityError
from infra.registry import MANIFEST_NAME, Registry, open_registry
from tests.conftest import REPO

pytestmark = pytest.mark.chaos

CHILD = textwrap.dedent(
    """
    import os, shutil, signal, sys
    from pathlib import Path
    from infra.registry import open_registry

    url, src, point = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    registry = open_registry(url)
    calls = {"n": 0}

    def kill_at(name, original, nth=1):
        def wrapper(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        return wrapper

    stage, _, nth = point.partition(":")
    if stage == "copy":  # file://: before the nth file is copied into the staging directory
        shutil.copy2 = kill_at(stage, shutil.copy2, int(nth))
    elif stage == "rename":  # file://: staged and verified, manifest written, not yet renamed into place
        Path.rename = kill_at(stage, Path.rename)
    elif stage == "upload":  # s3://: before the nth object is uploaded
        registry.client.upload_file = kill_at(stage, registry.client.upload_file, int(nth))
    elif stage == "manifest":  # s3://: every file uploaded, the manifest not yet put
        registry.client.put_object = kill_at(stage, registry.client.put_object)
    registry.publish(src, "toy", "v1", kind="model")
    print("published")
    """
)


def _artifact(tmp_path: Path, files: int = 6) -> Path:
    src = tmp_path / f"src-{uuid.uuid4().hex[:6]}"
    src.mkdir()
    for i in range(files):
        (src / f"shard-{i}.bin").write_bytes(os.urandom(64 * 1024))
    return src


def _publish_and_die(url: str, src: Path, point: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(src), point],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr[-2000:]


def _assert_nothing_partial_then_republish(registry: Registry, src: Path) -> None:
    assert [m.ref for m in registry.list()] == []
    assert registry.versions("toy") == []
    assert not registry.exists("toy@v1")
    with pytest.raises(ArtifactNotFound):
        registry.fetch("toy@v1")
    registry.publish(src, "toy", "v1", kind="model")
    fetched = registry.fetch("toy@v1")
    assert sorted(p.name for p in fetched.iterdir() if p.name != MANIFEST_NAME) == sorted(
        p.name for p in src.iterdir()
    )
    for path in src.iterdir():
        assert (fetched / path.name).read_bytes() == path.read_bytes()


@pytest.mark.parametrize("point", ["copy:1", "copy:4", "rename"])
def test_file_publish_killed_leaves_nothing_partial(
    tmp_path: Path, point: str, chaos_report: Callable[..., object]
) -> None:
    url = f"file://{tmp_path / 'registry'}"
    src = _artifact(tmp_path)
    _publish_and_die(url, src, point)
    registry = open_registry(url)
    _assert_nothing_partial_then_republish(registry, src)
    # A blob corrupted at rest afterwards is refused at fetch, naming the artifact and the file.
    (tmp_path / "registry" / "toy" / "v1" / "shard-2.bin").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(IntegrityError, match=r"toy@v1: file shard-2.bin does not match"):
        registry.fetch("toy@v1")
    chaos_report(
        f"SIGKILL during a file:// registry publish ({point})",
        requests=2,
        clean_errors=1,
        detail="nothing partial listed or fetchable; republish succeeded; a blob corrupted at rest refused naming toy@v1",
    )


@pytest.mark.integration
@pytest.mark.parametrize("point", ["upload:1", "upload:4", "manifest"])
def test_s3_publish_killed_leaves_nothing_partial(
    s3_endpoint: str,
    tmp_path: Path,
    point: str,
    monkeypatch: pytest.MonkeyPatch,
    chaos_report: Callable[..., object],
) -> None:
    import boto3

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))  # the fetch cache, for parent and child
    bucket = f"chaos-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/registry?endpoint_url={s3_endpoint}"
    src = _artifact(tmp_path)
    _publish_and_die(url, src, point)
    _assert_nothing_partial_then_republish(open_registry(url), src)
    chaos_report(
        f"SIGKILL during an S3 (moto) registry publish ({point})",
        requests=1,
        detail="nothing partial listed or fetchable; republish succeeded",
    )
