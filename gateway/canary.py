"""Canary traffic split and per-release metrics for the ingress.

The rollout controller (``release/rollout_controller.py``) publishes weights to a JSON file; every ingress
replica reads it (re-read when its mtime changes) and sends each client, sticky by API key or session id,
to the stable or the candidate release. The per-release metrics it records with ``ray.util.metrics`` are
what the controller analyses (Ray exports them as ``ray_tandem_*``).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from gateway.release_metrics import SERIES, RequestOutcome
from gateway.traffic import TrafficWeights, load_traffic_weights
from infra.errors import TandemError

log = logging.getLogger(__name__)

STABLE = "stable"
CANDIDATE = "candidate"
SESSION_HEADER = "x-session-id"
CANDIDATE_SUFFIX = "-candidate"


def candidate_model_id(stable_model_id: str) -> str:
    """The model id a stable tier's candidate serves under."""
    return stable_model_id + CANDIDATE_SUFFIX


def candidate_app_name(app_name: str, tier_name: str) -> str:
    """The Serve application of one candidate tier deployed after the gateway started (``late_candidates``)."""
    return f"{app_name}-candidate-{tier_name}"


def deployment_name(model_id: str) -> str:
    """The Serve deployment Ray Serve LLM names after a tier's model id."""
    return "LLMServer:" + model_id.replace("/", "--").replace(".", "_")


class ReleaseSplitter:
    """Chooses the release for a sticky client key from the weights file (stable while there is none)."""

    def __init__(self, weights_file: Path | None, *, has_candidate: bool) -> None:
        self.weights_file = Path(weights_file) if weights_file else None
        self.has_candidate = has_candidate
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._weights = TrafficWeights()

    def weights(self) -> TrafficWeights:
        if self.weights_file is None:
            return self._weights
        try:
            mtime = os.stat(self.weights_file).st_mtime
        except OSError:
            mtime = None
        with self._lock:
            if mtime != self._mtime:
                try:
                    self._weights = load_traffic_weights(self.weights_file)
                except TandemError as exc:
                    # A half-written or corrupt file never moves traffic: keep the last good weights.
                    log.error("event=weights_unreadable path=%s error=%r", self.weights_file, str(exc))
                else:
                    self._mtime = mtime
                    log.info("event=weights_loaded candidate=%d", self._weights.candidate)
            return self._weights

    def release_for(self, sticky_key: str) -> str:
        if not self.has_candidate:
            return STABLE
        weights = self.weights()
        return weights.release_for(sticky_key) if weights.candidate else STABLE


class ReleaseMetrics:
    """Every series of :data:`gateway.release_metrics.SERIES` the ingress emits, tagged by release and tier,
    recorded through Ray (exported as ``ray_<name>``)."""

    # Kept beside telemetry.py's OTel request metrics on purpose: these count each engine attempt against its
    # release (a dead candidate that fails over still shows its 5xx to the rollout), those each client request.

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Histogram

        tags = ("release", "tier")
        self.series = [series for series in SERIES.values() if series.emit is not None]
        self.instruments: dict[str, Any] = {}
        for series in self.series:
            assert series.emitted_as is not None
            self.instruments[series.name] = (
                Histogram(
                    series.emitted_as, series.description, boundaries=list(series.boundaries), tag_keys=tags
                )
                if series.kind == "histogram"
                else Counter(series.emitted_as, series.description, tag_keys=tags)
            )

    def record(
        self, release: str, tier: str, *, server_error: bool, ttft_s: float | None, tpot_s: float | None
    ) -> None:
        tags = {"release": release, "tier": tier}
        outcome = RequestOutcome(server_error=server_error, ttft_s=ttft_s, tpot_s=tpot_s)
        for series in self.series:
            assert series.emit is not None
            value = series.emit(outcome)
            if value is None:
                continue
            instrument = self.instruments[series.name]
            if series.kind == "histogram":
                instrument.observe(value, tags)
            else:
                instrument.inc(value, tags)


def open_release_metrics() -> Any:
    """Ray metrics inside a Ray worker; None elsewhere (unit tests, scripts)."""
    try:
        import ray

        return ReleaseMetrics() if ray.is_initialized() else None
    except Exception as exc:  # metrics must never take the gateway down
        log.warning("event=release_metrics_unavailable error=%r", exc)
        return None
