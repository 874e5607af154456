"""The rollout controller: a persisted state machine that moves traffic to a candidate release step by step.

It talks to the world only through three protocols, so it runs the same against a live gateway and in
tests: a :class:`TrafficSplitter` (publishes weights to the ingress), a :class:`MetricsSource` (cumulative
per-release counters, e.g. scraped from the gateway's Prometheus ``/metrics``) and a :class:`Deployer`
(deploys or removes a release's tiers); their implementations are in :mod:`release.rollout_adapters`. Every decision goes to a JSONL audit log with its evidence; the
state is written atomically after every tick, so a restarted controller resumes where it stopped. Traffic
never stays on a removed release: weight goes to 0 first, the release is removed after a drain.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from gateway.traffic import RELEASES, ReleaseName, ReleaseSpec
from infra.errors import ArtifactExists, RolloutError
from infra.manifest import Lineage
from infra.registry import Registry, registry_step
from release.gate_verdict import read_gate_verdict
from release.rollout import (
    MetricsSnapshot,
    RolloutConfig,
    evaluate_analysis,
    window_metrics,
)

# The adapters live in their own module; these names stay importable from here.
from release.rollout_adapters import (
    CommandDeployer,
    Deployer,
    FileTrafficSplitter,
    MetricsSource,
    PrometheusMetricsSource,
    TrafficSplitter,
    atomic_write_text,
    load_deployer,
)

__all__ = [
    "AUDIT_FILE",
    "COMMAND_FILE",
    "STATE_FILE",
    "CommandDeployer",
    "Deployer",
    "FileTrafficSplitter",
    "MetricsSource",
    "PrometheusMetricsSource",
    "RolloutController",
    "RolloutPhase",
    "RolloutState",
    "TrafficSplitter",
    "atomic_write_text",
    "controller_lock",
    "load_state",
    "open_controller",
    "request_command",
]

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
AUDIT_FILE = "audit.jsonl"
COMMAND_FILE = "command.json"


# ---------------------------------------------------------------------------------------------- state
class RolloutPhase(StrEnum):
    PENDING = "pending"  # waiting for the gate; nothing deployed
    RUNNING = "running"  # at steps[step_index]
    ROLLING_BACK = "rolling_back"  # candidate at weight 0, draining before removal
    PROMOTING = "promoting"  # candidate at weight 100, stable draining before removal
    ROLLED_BACK = "rolled_back"
    PROMOTED = "promoted"
    GATE_FAILED = "gate_failed"
    ABORTED = "aborted"  # aborted before anything was deployed


TERMINAL_PHASES = {
    RolloutPhase.ROLLED_BACK,
    RolloutPhase.PROMOTED,
    RolloutPhase.GATE_FAILED,
    RolloutPhase.ABORTED,
}


def _all_stable() -> dict[ReleaseName, int]:
    return {"stable": 100, "candidate": 0}


class RolloutState(BaseModel):
    """Everything a restarted controller needs to continue; written after every tick."""

    rollout_id: str
    name: str
    phase: RolloutPhase = RolloutPhase.PENDING
    step_index: int = -1
    weights: dict[ReleaseName, int] = Field(default_factory=_all_stable)
    step_started_at: float | None = None
    window_start: MetricsSnapshot | None = None
    draining_since: float | None = None
    metric_failures: int = 0
    reason: str = ""
    finished_at: float | None = None
    report_ref: str | None = None
    updated_at: float = 0

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


def load_state(state_dir: Path) -> RolloutState | None:
    """The persisted state in ``state_dir``, or None when no rollout was started there."""
    path = Path(state_dir) / STATE_FILE
    if not path.is_file():
        return None
    try:
        return RolloutState.model_validate_json(path.read_text())
    except (ValidationError, ValueError) as exc:
        raise RolloutError(f"{path}: unreadable rollout state: {exc}") from exc


def request_command(state_dir: Path, action: str, reason: str) -> None:
    """Ask the controller (running or next started) to ``promote`` or ``abort`` at its next tick."""
    if action not in ("promote", "abort"):
        raise RolloutError(f"unknown rollout command {action!r}: use promote or abort")
    atomic_write_text(Path(state_dir) / COMMAND_FILE, json.dumps({"action": action, "reason": reason}))


# ---------------------------------------------------------------------------------------------- controller
class RolloutController:
    """Drives one rollout: gate, then each step (hold / advance / roll back), then promotion.

    ``tick()`` makes one decision and persists it; ``run()`` ticks until an end state. Constructed over a
    ``state_dir`` that already holds a state, it resumes that rollout (re-publishing its current weights).
    """

    def __init__(
        self,
        config: RolloutConfig,
        *,
        splitter: TrafficSplitter,
        metrics: MetricsSource,
        deployer: Deployer,
        state_dir: Path,
        registry: Registry | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config, self.splitter, self.metrics, self.deployer = config, splitter, metrics, deployer
        self.registry, self.clock, self.sleep = registry, clock, sleep
        self.state_dir = Path(state_dir)
        self.releases: dict[ReleaseName, ReleaseSpec] = {
            "stable": config.stable,
            "candidate": config.candidate,
        }
        existing = load_state(self.state_dir)
        if existing is not None and existing.name != config.name:
            raise RolloutError(
                f"{self.state_dir}: holds rollout {existing.name!r}, not {config.name!r}; use another state dir"
            )
        self._resumed = existing is not None and not existing.terminal
        stamp = datetime.fromtimestamp(clock(), UTC).strftime("%Y%m%d-%H%M%S")
        self.state = existing or RolloutState(rollout_id=f"{stamp}-{secrets.token_hex(2)}", name=config.name)
        if existing is None:
            self._save()

    # -- persistence and audit ----------------------------------------------------------------------
    @property
    def audit_path(self) -> Path:
        return self.state_dir / AUDIT_FILE

    def _save(self) -> None:
        self.state.updated_at = self.clock()
        atomic_write_text(self.state_dir / STATE_FILE, self.state.model_dump_json(indent=2))

    def _audit(self, decision: str, reason: str, **evidence: Any) -> None:
        record = {
            "time": datetime.fromtimestamp(self.clock(), UTC).isoformat(),
            "rollout_id": self.state.rollout_id,
            "decision": decision,
            "reason": reason,
            "phase": self.state.phase.value,
            "step": self.state.step_index,
            "weights": dict(self.state.weights),
            **evidence,
        }
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self.audit_path.open("a") as stream:
            stream.write(json.dumps(record, default=str) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        log.info(
            "rollout.decision id=%s decision=%s phase=%s step=%d reason=%s",
            self.state.rollout_id,
            decision,
            self.state.phase.value,
            self.state.step_index,
            reason,
        )

    def audit_records(self) -> Iterator[dict[str, Any]]:
        if self.audit_path.is_file():
            for line in self.audit_path.read_text().splitlines():
                if line.strip():
                    yield json.loads(line)

    # -- transitions --------------------------------------------------------------------------------
    def _set_weights(self, candidate: int) -> None:
        self.state.weights = {"stable": 100 - candidate, "candidate": candidate}
        self.splitter.set_weights(dict(self.state.weights))

    def _enter_step(self, index: int) -> None:
        self.state.phase, self.state.step_index = RolloutPhase.RUNNING, index
        self._set_weights(self.config.steps[index].weight)
        self.state.metric_failures = 0
        self.state.step_started_at, self.state.window_start = self.clock(), self._try_snapshot()

    def _begin_exit(self, phase: RolloutPhase, reason: str) -> None:
        """Move all traffic off the release about to be removed; removal waits for the drain."""
        self.state.phase, self.state.reason = phase, reason
        self._set_weights(100 if phase is RolloutPhase.PROMOTING else 0)
        self.state.draining_since = self.clock()

    def _try_snapshot(self) -> MetricsSnapshot | None:
        try:
            return self.metrics.snapshot()
        except Exception as exc:  # any source failure counts against max_metric_failures
            self.state.metric_failures += 1
            self._audit(
                "metrics_unavailable", f"{type(exc).__name__}: {exc}", failures=self.state.metric_failures
            )
            return None

    # -- operator commands --------------------------------------------------------------------------
    def promote(self, reason: str = "operator promote") -> RolloutState:
        """Force promotion: all traffic to the candidate now, stable removed after the drain."""
        if self.state.phase not in (RolloutPhase.RUNNING, RolloutPhase.PROMOTING):
            raise RolloutError(f"cannot promote a rollout that is {self.state.phase.value}")
        if self.state.phase is RolloutPhase.RUNNING:
            self._begin_exit(RolloutPhase.PROMOTING, reason)
            self._audit("promote", reason, forced=True)
        self._save()
        return self.state

    def abort(self, reason: str = "operator abort") -> RolloutState:
        """Force a rollback: candidate to weight 0 now, removed after the drain (nothing to do if pending)."""
        if self.state.terminal:
            raise RolloutError(f"cannot abort a rollout that is {self.state.phase.value}")
        if self.state.phase is RolloutPhase.PENDING:
            self.state.phase, self.state.reason = RolloutPhase.ABORTED, reason
            self._audit("abort", reason, forced=True)
            self._finish()
        elif self.state.phase is not RolloutPhase.ROLLING_BACK:
            self._begin_exit(RolloutPhase.ROLLING_BACK, reason)
            self._audit("rollback", reason, forced=True)
        self._save()
        return self.state

    def _apply_command(self) -> None:
        path = self.state_dir / COMMAND_FILE
        if not path.is_file():
            return
        text = path.read_text()
        path.unlink()
        try:
            command = json.loads(text)
            action, reason = command["action"], str(command.get("reason") or f"operator {command['action']}")
            if action not in ("promote", "abort"):
                raise RolloutError(f"unknown command {action!r}")
            (self.promote if action == "promote" else self.abort)(reason)
        except (RolloutError, ValueError, KeyError, TypeError) as exc:
            self._audit("command_refused", f"{type(exc).__name__}: {exc}", command=text[:500])

    # -- the loop -----------------------------------------------------------------------------------
    def tick(self) -> RolloutState:
        """Make one decision from the current phase and metrics, persist it, and return the state."""
        if self._resumed:
            self._resumed = False
            if self.state.phase is not RolloutPhase.PENDING:
                self.splitter.set_weights(dict(self.state.weights))
            self._audit("resume", "controller restarted; current weights re-published")
        self._apply_command()
        phase = self.state.phase
        if phase is RolloutPhase.PENDING:
            self._check_gate()
        elif phase is RolloutPhase.RUNNING:
            self._analyse()
        elif phase in (RolloutPhase.ROLLING_BACK, RolloutPhase.PROMOTING):
            self._finish_exit()
        if self.state.terminal:
            self._finish()
        self._save()
        return self.state

    def run(self, poll_interval: float, max_ticks: int | None = None) -> RolloutState:
        """Tick every ``poll_interval`` seconds until an end state (or ``max_ticks``)."""
        ticks = 0
        while not self.tick().terminal:
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
            self.sleep(poll_interval)
        return self.state

    def _check_gate(self) -> None:
        try:
            verdict, source = read_gate_verdict(self.config.gate, self.registry)
        except RolloutError as exc:
            self._audit("gate_error", str(exc))
            raise
        evidence = {"gate": {"source": source, "verdict": verdict}}
        if verdict != "pass":
            self.state.phase, self.state.reason = RolloutPhase.GATE_FAILED, f"gate verdict is {verdict!r}"
            self._audit("gate_failed", self.state.reason, **evidence)
            return
        self._audit("gate_passed", f"gate verdict is 'pass' ({source})", **evidence)
        try:
            self.deployer.deploy("candidate", self.config.candidate)
        except RolloutError as exc:
            # A candidate whose engine cannot start never got traffic: roll back (remove whatever half
            # started, after the drain) instead of leaving the rollout stuck or the controller crashed.
            self._begin_exit(RolloutPhase.ROLLING_BACK, f"candidate failed to deploy: {exc}")
            self._audit("rollback", self.state.reason)
            return
        self._enter_step(0)
        self._audit("start_step", f"candidate deployed; weight {self.config.steps[0].weight}")

    def _analyse(self) -> None:
        state, rollback = self.state, self.config.rollback
        snapshot = self._try_snapshot()
        if snapshot is None:
            if state.metric_failures >= rollback.max_metric_failures:
                self._begin_exit(
                    RolloutPhase.ROLLING_BACK, f"{state.metric_failures} consecutive metric failures"
                )
                self._audit("rollback", state.reason)
            return
        state.metric_failures = 0
        if state.window_start is None:  # the step began while metrics were unreadable: the window starts now
            state.window_start, state.step_started_at = snapshot, snapshot.taken_at
            return
        assert state.step_started_at is not None
        step = self.config.steps[state.step_index]
        window = {
            release: window_metrics(state.window_start.releases[release], snapshot.releases[release])
            for release in RELEASES
        }
        checks = evaluate_analysis(
            self.config.thresholds(state.step_index), window["candidate"], window["stable"]
        )
        elapsed = self.clock() - state.step_started_at
        evidence = {
            "window": {"start": state.window_start.taken_at, "end": snapshot.taken_at, "seconds": elapsed},
            "metrics": {release: metrics.model_dump() for release, metrics in window.items()},
            "checks": [check.model_dump() for check in checks],
            "requirements": {
                "min_duration_seconds": step.min_duration_seconds,
                "min_requests": step.min_requests,
                "candidate_requests": window["candidate"].requests,
            },
        }
        failed = [f"{c.metric} {c.limit}: {c.detail}" for c in checks if c.status == "fail"]
        trusted = window["candidate"].requests >= rollback.min_requests
        if failed and trusted and rollback.automatic:
            self._begin_exit(RolloutPhase.ROLLING_BACK, "threshold failed: " + "; ".join(failed))
            self._audit("rollback", state.reason, **evidence)
        elif failed:
            why = (
                "automatic rollback is off; waiting for an operator"
                if trusted
                else (f"fewer than {rollback.min_requests} candidate requests to trust it")
            )
            self._audit("hold", f"threshold failing ({'; '.join(failed)}); {why}", **evidence)
        elif elapsed < step.min_duration_seconds or window["candidate"].requests < step.min_requests:
            self._audit("hold", f"step {state.step_index} needs more time or candidate requests", **evidence)
        elif state.step_index + 1 < len(self.config.steps):
            self._audit("advance", f"step {state.step_index} passed", **evidence)
            self._enter_step(state.step_index + 1)
            self._audit("start_step", f"weight {self.config.steps[state.step_index].weight}")
        else:
            self._begin_exit(RolloutPhase.PROMOTING, f"all {len(self.config.steps)} steps passed")
            self._audit("promote", state.reason, **evidence)

    def _finish_exit(self) -> None:
        state = self.state
        assert state.draining_since is not None
        # Re-publish before removing: after a restart the splitter may not hold the exit weights yet.
        self.splitter.set_weights(dict(state.weights))
        if self.clock() - state.draining_since < self.config.rollback.drain_seconds:
            return
        removed: ReleaseName = "stable" if state.phase is RolloutPhase.PROMOTING else "candidate"
        self.deployer.remove(removed, self.releases[removed])
        state.phase = RolloutPhase.PROMOTED if removed == "stable" else RolloutPhase.ROLLED_BACK
        self._audit("removed", f"{removed} removed after {self.config.rollback.drain_seconds:g}s at weight 0")

    def _finish(self) -> None:
        """Record the end once, then publish the audit log and final state as a ``report`` artifact (once)."""
        if self.state.finished_at is None:
            self.state.finished_at = self.clock()
            self._audit("finished", f"rollout ended {self.state.phase.value}: {self.state.reason}")
            self._save()
        if self.state.report_ref is not None:
            return
        if self.registry is None:
            log.warning("rollout.report id=%s published=false reason=no-registry", self.state.rollout_id)
            return
        name, version = f"rollout-{self.config.name}", self.state.rollout_id
        parents = [ref for spec in self.releases.values() for ref in (spec.model, spec.draft) if ref]
        lineage = Lineage(
            parents=parents, produced_by="tandem rollout", config=self.config.model_dump(mode="json")
        )
        with tempfile.TemporaryDirectory() as staging:
            shutil.copy2(self.audit_path, Path(staging) / AUDIT_FILE)
            shutil.copy2(self.state_dir / STATE_FILE, Path(staging) / STATE_FILE)
            try:
                with registry_step(f"publishing the rollout report {name}@{version} (rerun to retry)"):
                    self.registry.publish(Path(staging), name, version, kind="report", lineage=lineage,
                                          metadata={"phase": self.state.phase.value, "reason": self.state.reason})  # fmt: skip
            except ArtifactExists:
                pass  # published before a restart: the version is immutable and already complete
        self.state.report_ref = f"{name}@{version}"


@contextlib.contextmanager
def controller_lock(state_dir: Path, *, wait: bool = False) -> Iterator[bool]:
    """Hold the state dir's lock (one controller per rollout); yields False if another process holds it."""
    import fcntl

    Path(state_dir).mkdir(parents=True, exist_ok=True)
    with (Path(state_dir) / "lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_controller(
    config: RolloutConfig,
    state_dir: Path,
    *,
    registry: Registry | None = None,
    metrics_urls: list[str] | None = None,
) -> RolloutController:
    """A controller wired to the real world: weights file for the ingress, /metrics, the configured deployer."""
    metrics_config = (
        config.metrics.model_copy(update={"urls": metrics_urls}) if metrics_urls else config.metrics
    )
    releases: dict[ReleaseName, ReleaseSpec] = {"stable": config.stable, "candidate": config.candidate}
    return RolloutController(
        config,
        splitter=FileTrafficSplitter(config.traffic.weights_file, config.traffic.salt, releases),
        metrics=PrometheusMetricsSource(metrics_config),
        deployer=load_deployer(config),
        state_dir=state_dir,
        registry=registry,
    )
