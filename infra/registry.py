"""Artifact registry: immutable, verified versions of models, drafts, logs and reports.

One interface, two backends: a directory (``file://``, the default) and S3 (``s3://bucket/prefix``, any
S3-compatible endpoint through boto3). A version is committed by writing its manifest *last*, so a crash
mid-publish never leaves a half-written version visible; every fetch re-hashes the files against the
manifest and refuses a mismatch.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from infra.errors import (
    ArtifactExists,
    ArtifactNotFound,
    IntegrityError,
    RegistryError,
    RegistryUnavailable,
)
from infra.manifest import (
    MANIFEST_NAME,
    ArtifactKind,
    ArtifactManifest,
    Lineage,
    scan_directory,
    sha256_file,
)

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
DEFAULT_REGISTRY_URL = "file://" + str(
    Path(os.environ.get("TANDEM_HOME", "~/.cache/tandem")).expanduser() / "registry"
)


def parse_ref(ref: str) -> tuple[str, str | None]:
    """Split ``name@version`` (version optional, ``latest`` means none) and validate both parts."""
    name, _, version = ref.partition("@")
    for part, label in ((name, "name"), (version, "version")):
        if part and not _NAME.match(part):
            raise RegistryError(
                f"invalid artifact {label} {part!r} in ref {ref!r}: use lowercase letters, digits, '.', '_' or '-'"
            )
    if not name:
        raise RegistryError(f"invalid artifact ref {ref!r}: expected 'name' or 'name@version'")
    return name, (version if version and version != "latest" else None)


class Registry(ABC):
    """Immutable artifact store. Subclasses implement raw storage; this class owns the rules."""

    url: str

    # -- storage primitives -------------------------------------------------------------------------
    @abstractmethod
    def _read_manifest(self, name: str, version: str) -> ArtifactManifest | None: ...

    @abstractmethod
    def _write_version(self, src: Path, manifest: ArtifactManifest) -> None: ...

    @abstractmethod
    def _materialise(self, manifest: ArtifactManifest) -> Path:
        """Return a local directory holding the version's files (may download)."""

    @abstractmethod
    def _names(self) -> list[str]: ...

    @abstractmethod
    def _versions(self, name: str) -> list[str]: ...

    # -- public API ---------------------------------------------------------------------------------
    def publish(
        self,
        src: Path,
        name: str,
        version: str,
        *,
        kind: ArtifactKind = "other",
        lineage: Lineage | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ArtifactManifest:
        """Store the directory ``src`` as ``name@version``; refuses to overwrite an existing version."""
        parse_ref(f"{name}@{version}")
        src = Path(src)
        if not src.is_dir():
            raise RegistryError(f"cannot publish {src}: not a directory")
        if self._read_manifest(name, version) is not None:
            raise ArtifactExists(f"{name}@{version} already exists in {self.url}; versions are immutable")
        files = scan_directory(src)
        if not files:
            raise RegistryError(f"cannot publish {src}: it holds no files")
        manifest = ArtifactManifest(
            name=name,
            version=version,
            kind=kind,
            files=files,
            lineage=lineage or Lineage(),
            metadata=metadata or {},
        )
        self._write_version(src, manifest)
        return manifest

    def manifest(self, ref: str) -> ArtifactManifest:
        """The manifest of ``name@version`` (or of the newest version of ``name``)."""
        name, version = parse_ref(ref)
        if version is None:
            versions = self.versions(name)
            if not versions:
                raise ArtifactNotFound(f"no artifact named {name!r} in {self.url}")
            return versions[-1]
        found = self._read_manifest(name, version)
        if found is None:
            raise ArtifactNotFound(f"{name}@{version} not found in {self.url}")
        return found

    def exists(self, ref: str) -> bool:
        try:
            self.manifest(ref)
        except ArtifactNotFound:
            return False
        return True

    def versions(self, name: str) -> list[ArtifactManifest]:
        """All committed versions of ``name``, oldest first."""
        found = [m for v in self._versions(name) if (m := self._read_manifest(name, v)) is not None]
        return sorted(found, key=lambda m: m.created_at)

    def list(self, kind: ArtifactKind | None = None) -> list[ArtifactManifest]:
        """Every committed version in the registry, optionally of one kind."""
        manifests = [m for name in self._names() for m in self.versions(name)]
        return [m for m in manifests if kind is None or m.kind == kind]

    def fetch(self, ref: str) -> Path:
        """A local directory with the verified files of ``ref``; raises IntegrityError on any mismatch."""
        manifest = self.manifest(ref)
        root = self._materialise(manifest)
        verify_directory(root, manifest)
        return root


@contextlib.contextmanager
def registry_step(step: str) -> Iterator[None]:
    """Name the step a registry outage interrupts: a :class:`RegistryUnavailable` raised inside says
    ``while <step>`` (e.g. "fetching tier 'standard''s model smollm2-135m-instruct@base")."""
    try:
        yield
    except RegistryUnavailable as exc:
        named = exc.during(step)
        if named is exc:
            raise
        raise named from exc.__cause__


def verify_directory(root: Path, manifest: ArtifactManifest) -> None:
    """Check every file the manifest lists: present, same size, same sha256."""
    for entry in manifest.files:
        path = root / entry.path
        if not path.is_file():
            raise IntegrityError(f"{manifest.ref}: file {entry.path} is missing")
        if path.stat().st_size != entry.size or sha256_file(path) != entry.sha256:
            raise IntegrityError(
                f"{manifest.ref}: file {entry.path} does not match its sha256 in the manifest"
            )


class FileRegistry(Registry):
    """A registry in a local directory: ``<root>/<name>/<version>/{files..., tandem-manifest.json}``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = f"file://{self.root}"

    def _dir(self, name: str, version: str) -> Path:
        return self.root / name / version

    def _read_manifest(self, name: str, version: str) -> ArtifactManifest | None:
        path = self._dir(name, version) / MANIFEST_NAME
        if not path.is_file():
            return None
        try:
            return ArtifactManifest.model_validate_json(path.read_text())
        except ValueError as exc:
            raise IntegrityError(f"{name}@{version}: manifest {path} is unreadable: {exc}") from exc

    def _write_version(self, src: Path, manifest: ArtifactManifest) -> None:
        final = self._dir(manifest.name, manifest.version)
        final.parent.mkdir(parents=True, exist_ok=True)
        # Stage beside the final path, then rename: readers never see a partial version.
        staging = Path(tempfile.mkdtemp(prefix=f".{manifest.version}.", dir=final.parent))
        try:
            for entry in manifest.files:
                target = staging / entry.path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / entry.path, target)
            verify_directory(staging, manifest)
            (staging / MANIFEST_NAME).write_text(manifest.model_dump_json(indent=2))
            try:
                staging.rename(final)
            except OSError as exc:
                raise ArtifactExists(f"{manifest.ref} was published concurrently") from exc
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def _materialise(self, manifest: ArtifactManifest) -> Path:
        return self._dir(manifest.name, manifest.version)

    def _names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _versions(self, name: str) -> list[str]:
        base = self.root / name
        if not base.is_dir():
            return []
        # A staging directory (".<version>.*") holds its manifest just before the rename that publishes it:
        # one left by a killed publish is not a version (tests/chaos/test_registry_kill.py).
        return sorted(
            p.name for p in base.iterdir() if not p.name.startswith(".") and (p / MANIFEST_NAME).is_file()
        )


@dataclass(frozen=True)
class S3ClientSettings:
    """How the S3 client reaches its endpoint: bounded, so a down endpoint fails the command in seconds
    (botocore's defaults, 60 s connect timeout and 5 attempts, hang for minutes on an unreachable host).
    Each field can be set in the registry URL's query, e.g. ``s3://bucket/prefix?connect_timeout=2``."""

    connect_timeout: float = 5.0
    """Seconds to open a connection, per attempt."""
    read_timeout: float = 60.0
    """Seconds to wait for bytes on an open connection, per attempt."""
    max_attempts: int = 3
    """Tries per request, the first included (botocore "standard" retries, backoff up to 2^n s between)."""

    @classmethod
    def from_query(cls, url: str, query: dict[str, list[str]]) -> S3ClientSettings:
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name not in query:
                continue
            raw = query[spec.name][-1]
            try:
                value = int(raw) if spec.type in (int, "int") else float(raw)
            except ValueError:
                value = -1
            if value <= 0:
                raise RegistryError(
                    f"invalid registry URL {url!r}: {spec.name}={raw!r} must be a positive number"
                )
            values[spec.name] = value
        return cls(**values)

    def client_config(self) -> Any:
        from botocore.config import Config

        return Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries={"total_max_attempts": self.max_attempts, "mode": "standard"},
        )


class S3Registry(Registry):
    """A registry in an S3 bucket (AWS, MinIO, or any S3-compatible ``endpoint_url``).

    Every storage call goes through :meth:`_storage`, which turns botocore's failures into the registry's
    errors: :class:`RegistryUnavailable` when the endpoint cannot be reached, :class:`RegistryError` otherwise.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        cache_dir: Path | None = None,
        client: Any = None,
        settings: S3ClientSettings | None = None,
    ) -> None:
        import boto3  # Imported here so file-only users never pay for botocore's import.

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = client or boto3.client(
            "s3", endpoint_url=endpoint_url, config=(settings or S3ClientSettings()).client_config()
        )
        home = Path(os.environ.get("TANDEM_HOME", "~/.cache/tandem")).expanduser()
        self.cache_dir = Path(cache_dir or home / "s3-cache" / bucket / (self.prefix or "_"))

    @property
    def location(self) -> str:
        """The URL and the endpoint it resolves to ($AWS_ENDPOINT_URL included), for error messages."""
        endpoint = getattr(getattr(self.client, "meta", None), "endpoint_url", None)
        return f"{self.url} (endpoint {endpoint})" if endpoint else self.url

    @contextlib.contextmanager
    def _storage(self, operation: str) -> Iterator[None]:
        """Run S3 calls for ``operation`` ("reading the manifest of x@v1"), translating their failures."""
        from boto3.exceptions import S3TransferFailedError, S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

        try:
            yield
        except (ConnectionError, HTTPClientError) as exc:  # refused, timed out, dropped mid-response
            raise RegistryUnavailable(self.location, operation, str(exc)) from exc
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status >= 500:  # still failing after the retries: the service is down, not the request wrong
                raise RegistryUnavailable(self.location, operation, str(exc)) from exc
            raise RegistryError(f"S3 error {operation} in {self.location}: {exc}") from exc
        except (BotoCoreError, S3UploadFailedError, S3TransferFailedError) as exc:  # no credentials, ...
            raise RegistryError(f"S3 error {operation} in {self.location}: {exc}") from exc

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _read_manifest(self, name: str, version: str) -> ArtifactManifest | None:
        from botocore.exceptions import ClientError

        with self._storage(f"reading the manifest of {name}@{version}"):
            try:
                response = self.client.get_object(
                    Bucket=self.bucket, Key=self._key(name, version, MANIFEST_NAME)
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404", "NotFound"}:
                    return None
                raise
            body = response["Body"].read()
        try:
            return ArtifactManifest.model_validate_json(body)
        except ValueError as exc:
            raise IntegrityError(f"{name}@{version}: manifest in {self.url} is unreadable: {exc}") from exc

    def _write_version(self, src: Path, manifest: ArtifactManifest) -> None:
        with self._storage(f"uploading {manifest.ref}"):
            for entry in manifest.files:
                self.client.upload_file(
                    str(src / entry.path), self.bucket, self._key(manifest.name, manifest.version, entry.path)
                )
            # The manifest goes last: its presence is what makes the version exist.
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(manifest.name, manifest.version, MANIFEST_NAME),
                Body=manifest.model_dump_json(indent=2).encode(),
            )

    def _materialise(self, manifest: ArtifactManifest) -> Path:
        root = self.cache_dir / manifest.name / manifest.version
        for entry in manifest.files:
            target = root / entry.path
            if (
                target.is_file()
                and target.stat().st_size == entry.size
                and sha256_file(target) == entry.sha256
            ):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            with self._storage(f"downloading {manifest.ref} file {entry.path}"):
                self.client.download_file(
                    self.bucket, self._key(manifest.name, manifest.version, entry.path), str(partial)
                )
            partial.replace(target)
        return root

    def _list_prefixes(self, prefix: str, operation: str) -> list[str]:
        found: list[str] = []
        with self._storage(operation):
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    found.append(common["Prefix"][len(prefix) :].strip("/"))
        return sorted(found)

    def _names(self) -> list[str]:
        return self._list_prefixes(self._key() + "/" if self.prefix else "", "listing artifacts")

    def _versions(self, name: str) -> list[str]:
        return self._list_prefixes(self._key(name) + "/", f"listing the versions of {name}")


def open_registry(url: str | None = None) -> Registry:
    """Open a registry from a URL: ``file:///path``, a plain path, or ``s3://bucket/prefix[?endpoint_url=...]``.

    Without a URL, ``$TANDEM_REGISTRY`` or ``~/.cache/tandem/registry`` is used. For S3 the endpoint also
    comes from ``$AWS_ENDPOINT_URL`` (boto3's own convention) when the URL does not name one; the query may
    also set :class:`S3ClientSettings` (``connect_timeout``, ``read_timeout``, ``max_attempts``).
    """
    url = url or os.environ.get("TANDEM_REGISTRY") or DEFAULT_REGISTRY_URL
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return FileRegistry(Path(parsed.path if parsed.scheme else url))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise RegistryError(f"invalid registry URL {url!r}: expected s3://bucket/prefix")
        query = parse_qs(parsed.query)
        allowed = {"endpoint_url", *(spec.name for spec in fields(S3ClientSettings))}
        unknown = sorted(set(query) - allowed)
        if unknown:
            raise RegistryError(
                f"invalid registry URL {url!r}: unknown option {unknown[0]!r}; use {', '.join(sorted(allowed))}"
            )
        endpoint = query.get("endpoint_url", [None])[0]
        settings = S3ClientSettings.from_query(url, query)
        return S3Registry(parsed.netloc, parsed.path, endpoint_url=endpoint, settings=settings)
    raise RegistryError(f"unsupported registry URL {url!r}: use file:// or s3://")
