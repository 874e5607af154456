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
    """``tandem_*`` counters and histograms tagged by release and tier, exported through Ray."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Histogram

        tags = ("release", "tier")
        self.requests = Counter("tandem_requests_total", "Requests finished.", tag_keys=tags)
        self.errors = Counter("tandem_request_errors_total", "Requests that ended in a 5xx.", tag_keys=tags)
        self.ttft = Histogram(
            "tandem_time_to_first_token_seconds",
            "Time to first output token.",
            boundaries=[0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16],
            tag_keys=tags,
        )
        self.tpot = Histogram(
            "tandem_time_per_output_token_seconds",
            "Time per output token after the first.",
            boundaries=[0.01, 0.02, 0.04, 0.08, 0.15, 0.25, 0.5, 1],
            tag_keys=tags,
        )

    def record(
        self, release: str, tier: str, *, server_error: bool, ttft_s: float | None, tpot_s: float | None
    ) -> None:
        tags = {"release": release, "tier": tier}
        self.requests.inc(1, tags)
        if server_error:
            self.errors.inc(1, tags)
        if ttft_s is not None:
            self.ttft.observe(ttft_s, tags)
        if tpot_s is not None:
            self.tpot.observe(tpot_s, tags)


def open_release_metrics() -> Any:
    """Ray metrics inside a Ray worker; None elsewhere (unit tests, scripts)."""
    try:
        import ray

        return ReleaseMetrics() if ray.is_initialized() else None
    except Exception as exc:  # metrics must never take the gateway down
        log.warning("event=release_metrics_unavailable error=%r", exc)
        return None
