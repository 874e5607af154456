"""The rollout controller's adapters to the world: where metrics come from, how weights reach the
ingress, and how a release's tiers are deployed.

Each adapter satisfies one protocol of :class:`~release.rollout_controller.RolloutController`. Deployers are
chosen by the rollout config: ``deployment.deployer`` names a factory by import path (``module:attribute``,
as Ray Serve's ``import_path``), so a package downstream of ``infra`` (the gateway's in-place Serve update)
plugs in without ``infra`` importing it; unset, the ``deploy`` / ``remove`` commands run.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from gateway.release_metrics import SERIES
from gateway.traffic import RELEASES, ReleaseName, ReleaseSpec, TrafficWeights
from infra.errors import RolloutError
from release.rollout import Histogram, MetricsConfig, MetricsSnapshot, ReleaseCounters, RolloutConfig

log = logging.getLogger(__name__)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` so readers see the old or the new content, never a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# ---------------------------------------------------------------------------------------------- metrics
class MetricsSource(Protocol):
    def snapshot(self) -> MetricsSnapshot:
        """Cumulative counters of both releases now; raises on an unreachable or unreadable source."""
        ...


class PrometheusMetricsSource:
    """Scrapes a Prometheus text endpoint (the gateway's ``/metrics``) into per-release counters.

    Samples are summed over every label the release's selector does not fix (tiers, replicas, codes).
    """

    def __init__(self, config: MetricsConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock

    def snapshot(self) -> MetricsSnapshot:
        from prometheus_client.parser import text_string_to_metric_families

        samples: list[Any] = []
        for url in self.config.urls:
            try:
                response = httpx.get(url, timeout=self.config.timeout_seconds)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                raise RolloutError(f"cannot scrape {url}: {exc}") from exc
            try:
                samples += [
                    s for family in text_string_to_metric_families(response.text) for s in family.samples
                ]
            except ValueError as exc:
                raise RolloutError(f"{url}: not Prometheus text: {exc}") from exc
        releases = {release: self._counters(samples, release) for release in RELEASES}
        return MetricsSnapshot(taken_at=self.clock(), releases=releases)

    def _counters(self, samples: list[Any], release: ReleaseName) -> ReleaseCounters:
        config = self.config
        selector = config.release_selectors[release]
        engine_selector = (config.acceptance_selectors or config.release_selectors)[release]

        def total(name: str, labels: dict[str, str]) -> float:
            return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())

        def histogram(base: str) -> Histogram:
            buckets: dict[str, float] = {}
            for sample in samples:
                if sample.name == f"{base}_bucket" and selector.items() <= sample.labels.items():
                    le = sample.labels.get("le", "+Inf")
                    buckets[le] = buckets.get(le, 0.0) + sample.value
            return Histogram(
                buckets=buckets, sum=total(f"{base}_sum", selector), count=total(f"{base}_count", selector)
            )

        values: dict[str, Any] = {}
        for name, series in SERIES.items():  # every registered series, under its configured name
            exported = getattr(config, name)
            if series.kind == "histogram":
                values[name] = histogram(exported)
            else:
                values[name] = total(exported, engine_selector if series.selector == "engine" else selector)
        return ReleaseCounters(**values)


# ---------------------------------------------------------------------------------------------- traffic + deploy
class TrafficSplitter(Protocol):
    def set_weights(self, weights: dict[ReleaseName, int]) -> None:
        """Route ``weights[release]`` percent of sticky keys to each release (the two sum to 100)."""
        ...


class FileTrafficSplitter:
    """Publishes :class:`~release.rollout.TrafficWeights` as JSON, atomically, for the ingress to read.

    The ingress re-reads the file when its mtime changes (``load_traffic_weights``) and routes each request
    with ``weights.release_for(api_key or session_id)``.
    """

    def __init__(self, path: Path, salt: str, releases: dict[ReleaseName, ReleaseSpec]) -> None:
        self.path = Path(path)
        self.salt = salt
        self.releases = releases

    def set_weights(self, weights: dict[ReleaseName, int]) -> None:
        published = TrafficWeights(
            stable=weights["stable"],
            candidate=weights["candidate"],
            salt=self.salt,
            releases=self.releases,
            updated_at=datetime.now(UTC).isoformat(),
        )
        atomic_write_text(self.path, published.model_dump_json(indent=2) + "\n")


class Deployer(Protocol):
    def deploy(self, release: ReleaseName, spec: ReleaseSpec) -> None:
        """Start the release's tiers and return once they serve (idempotent)."""
        ...

    def remove(self, release: ReleaseName, spec: ReleaseSpec) -> None:
        """Remove the release's tiers; the controller calls this only after its weight is 0."""
        ...


class CommandDeployer:
    """Runs the configured argv lists (``kubectl``, ``serve deploy``...) with the release substituted."""

    def __init__(
        self, deploy: list[str] | None, remove: list[str] | None, timeout_seconds: float = 600
    ) -> None:
        self.commands = {"deploy": deploy, "remove": remove}
        self.timeout_seconds = timeout_seconds

    def _run(self, action: str, release: ReleaseName, spec: ReleaseSpec) -> None:
        template = self.commands[action]
        if not template:
            log.info("rollout.deploy action=%s release=%s managed=externally", action, release)
            return
        argv = [part.format(release=release, model=spec.model, draft=spec.draft or "") for part in template]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_seconds)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RolloutError(f"{action} {release}: {argv[0]} failed: {exc}") from exc
        if done.returncode != 0:
            raise RolloutError(f"{action} {release}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
        log.info("rollout.deploy action=%s release=%s argv=%s", action, release, argv)

    def deploy(self, release: ReleaseName, spec: ReleaseSpec) -> None:
        self._run("deploy", release, spec)

    def remove(self, release: ReleaseName, spec: ReleaseSpec) -> None:
        self._run("remove", release, spec)


DeployerFactory = Callable[[RolloutConfig], Deployer]


def load_deployer(config: RolloutConfig) -> Deployer:
    """The deployer ``config.deployment`` asks for: a ``module:attribute`` factory, else the commands."""
    deployment = config.deployment
    if deployment.deployer is None:
        return CommandDeployer(deployment.deploy, deployment.remove, deployment.timeout_seconds)
    module_name, _, attribute = deployment.deployer.partition(":")
    try:
        factory: DeployerFactory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise RolloutError(
            f"deployment.deployer {deployment.deployer!r}: cannot import it ({exc}); "
            "expected 'module:attribute', e.g. release.serve_deployer:ServeDeployer"
        ) from exc
    return factory(config)
