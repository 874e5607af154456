"""The artifact registry against a directory and against a real S3 HTTP server (moto)."""

from __future__ import annotations

import pickle
import time
import uuid
from pathlib import Path

import boto3
import pytest

from infra.errors import ArtifactExists, ArtifactNotFound, IntegrityError, RegistryError, RegistryUnavailable
from infra.manifest import Lineage
from infra.registry import FileRegistry, Registry, S3Registry, open_registry, parse_ref, registry_step
from tests.conftest import free_port


def _artifact(tmp_path: Path, payload: bytes = b"weights-v1") -> Path:
    src = tmp_path / f"src-{uuid.uuid4().hex[:6]}"
    (src / "sub").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(payload)
    (src / "sub" / "config.json").write_text('{"layers": 2}')
    return src


def _contract(registry: Registry, tmp_path: Path) -> None:
    manifest = registry.publish(
        _artifact(tmp_path),
        "toy-model",
        "v1",
        kind="model",
        lineage=Lineage(parents=["base@v0"], produced_by="test"),
        metadata={"k": 3},
    )
    assert manifest.ref == "toy-model@v1"
    assert {entry.path for entry in manifest.files} == {"model.safetensors", "sub/config.json"}
    fetched = registry.fetch("toy-model@v1")
    assert (fetched / "model.safetensors").read_bytes() == b"weights-v1"
    assert registry.manifest("toy-model").lineage.parents == ["base@v0"]

    with pytest.raises(ArtifactExists):
        registry.publish(_artifact(tmp_path, b"other"), "toy-model", "v1")

    registry.publish(_artifact(tmp_path, b"weights-v2"), "toy-model", "v2", kind="model")
    assert registry.manifest("toy-model@latest").version == "v2"
    assert [m.version for m in registry.versions("toy-model")] == ["v1", "v2"]
    assert [m.ref for m in registry.list(kind="model")] == ["toy-model@v1", "toy-model@v2"]
    assert registry.list(kind="draft") == []

    with pytest.raises(ArtifactNotFound):
        registry.manifest("toy-model@v9")
    with pytest.raises(ArtifactNotFound):
        registry.fetch("missing")


def test_file_registry_contract(tmp_path: Path) -> None:
    _contract(FileRegistry(tmp_path / "registry"), tmp_path)


def test_file_registry_refuses_corrupted_file(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(_artifact(tmp_path), "toy", "v1")
    stored = tmp_path / "registry" / "toy" / "v1" / "model.safetensors"
    stored.write_bytes(b"weights-v!")  # same size, different bytes
    with pytest.raises(IntegrityError, match="sha256"):
        registry.fetch("toy@v1")
    stored.unlink()
    with pytest.raises(IntegrityError, match="missing"):
        registry.fetch("toy@v1")


def test_failed_publish_leaves_no_version(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry")
    with pytest.raises(RegistryError):
        registry.publish(tmp_path / "does-not-exist", "toy", "v1")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RegistryError, match="no files"):
        registry.publish(empty, "toy", "v1")
    assert not registry.exists("toy@v1")


@pytest.mark.parametrize("ref", ["Bad Name@v1", "ok@v 1", "@v1", "../etc@v1"])
def test_invalid_refs_are_refused(ref: str) -> None:
    with pytest.raises(RegistryError):
        parse_ref(ref)


def test_open_registry_urls(tmp_path: Path) -> None:
    assert isinstance(open_registry(f"file://{tmp_path}"), FileRegistry)
    assert isinstance(open_registry(str(tmp_path)), FileRegistry)
    with pytest.raises(RegistryError, match="unsupported"):
        open_registry("ftp://host/x")
    with pytest.raises(RegistryError, match="bucket"):
        open_registry("s3:///prefix")


def test_s3_client_settings_come_from_the_url() -> None:
    registry = open_registry("s3://bucket/x?endpoint_url=http://127.0.0.1:9&connect_timeout=2&max_attempts=1")
    assert isinstance(registry, S3Registry)
    config = registry.client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (2.0, 60.0)
    assert config.retries == {"total_max_attempts": 1, "mode": "standard"}
    with pytest.raises(RegistryError, match=r"unknown option 'region'; use connect_timeout, endpoint_url"):
        open_registry("s3://bucket/x?region=eu")
    with pytest.raises(RegistryError, match="max_attempts='0' must be a positive number"):
        open_registry("s3://bucket/x?max_attempts=0")


def test_an_unreachable_s3_endpoint_is_a_registry_unavailable_naming_url_and_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in (
        ("AWS_ACCESS_KEY_ID", "t"),
        ("AWS_SECRET_ACCESS_KEY", "t"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(key, value)
    dead = f"http://127.0.0.1:{free_port()}"
    registry = open_registry(f"s3://bucket/x?endpoint_url={dead}&max_attempts=1")
    started = time.monotonic()
    with (
        pytest.raises(RegistryUnavailable) as raised,
        registry_step("fetching the standard tier's model toy@v1"),
    ):
        registry.fetch("toy@v1")
    assert time.monotonic() - started < 10
    assert str(raised.value).startswith(
        f"registry s3://bucket/x (endpoint {dead}) is unreachable while fetching the standard tier's model "
        "toy@v1 (reading the manifest of toy@v1): Could not connect to the endpoint URL"
    )
    assert str(pickle.loads(pickle.dumps(raised.value))) == str(
        raised.value
    )  # crosses Ray's process boundary


@pytest.mark.integration
def test_s3_registry_contract(s3_endpoint: str, tmp_path: Path) -> None:
    bucket = f"tandem-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    registry = open_registry(f"s3://{bucket}/releases?endpoint_url={s3_endpoint}")
    assert isinstance(registry, S3Registry)
    registry.cache_dir = tmp_path / "cache"
    _contract(registry, tmp_path)


@pytest.mark.integration
def test_s3_registry_refuses_corrupted_object(s3_endpoint: str, tmp_path: Path) -> None:
    bucket = f"tandem-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=bucket)
    registry = S3Registry(bucket, "r", endpoint_url=s3_endpoint, cache_dir=tmp_path / "cache")
    registry.publish(_artifact(tmp_path), "toy", "v1")
    client.put_object(Bucket=bucket, Key="r/toy/v1/model.safetensors", Body=b"tampered!!")
    with pytest.raises(IntegrityError):
        registry.fetch("toy@v1")
    # The corrupted download must not be served from the cache on the next fetch either.
    with pytest.raises(IntegrityError):
        registry.fetch("toy@v1")
