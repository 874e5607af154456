"""The rollout state machine against a simulated gateway: promotion, rollback, gate, restart, audit."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.traffic import ReleaseName, ReleaseSpec
from infra.errors import RolloutError
from infra.registry import FileRegistry
from release.rollout import Histogram, MetricsSnapshot, ReleaseCounters, RolloutConfig
from release.rollout_controller import (
    COMMAND_FILE,
    RolloutController,
    RolloutPhase,
    load_state,
    request_command,
)

BUCKETS = ["0.05", "0.1", "0.25", "0.5", "1.0", "2.0", "5.0", "+Inf"]


class Clock:
    def __init__(self) -> None:
        self.now = 1_790_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Quality:
    """How a simulated release behaves: error rate, TTFT and TPOT of every request, draft acceptance."""

    error_rate: float = 0.001
    ttft: float = 0.3
    tpot: float = 0.02
    acceptance: float = 0.7


def observe(histogram: Histogram, value: float, n: float) -> None:
    for le in BUCKETS:
        if float(le) >= value:
            histogram.buckets[le] = histogram.buckets.get(le, 0.0) + n
    histogram.sum += value * n
    histogram.count += n


class Splitter:
    def __init__(self) -> None:
        self.history: list[dict[ReleaseName, int]] = []

    @property
    def current(self) -> dict[ReleaseName, int]:
        return self.history[-1] if self.history else {"stable": 100, "candidate": 0}

    def set_weights(self, weights: dict[ReleaseName, int]) -> None:
        assert weights["stable"] + weights["candidate"] == 100
        self.history.append(dict(weights))


@dataclass
class Deployer:
    splitter: Splitter
    events: list[tuple[str, str, int]] = field(default_factory=list)

    def deploy(self, release: ReleaseName, spec: ReleaseSpec) -> None:
        self.events.append(("deploy", release, self.splitter.current[release]))

    def remove(self, release: ReleaseName, spec: ReleaseSpec) -> None:
        # Never remove a release that still has traffic.
        assert self.splitter.current[release] == 0, self.splitter.current
        self.events.append(("remove", release, self.splitter.current[release]))


class Gateway:
    """Cumulative per-release counters fed by traffic split according to the splitter's weights."""

    def __init__(self, splitter: Splitter, clock: Clock, candidate: Quality, stable: Quality | None = None):
        self.splitter, self.clock = splitter, clock
        self.quality = {"stable": stable or Quality(), "candidate": candidate}
        self.counters = {"stable": ReleaseCounters(), "candidate": ReleaseCounters()}
        self.unavailable = 0

    def flow(self, seconds: float, rps: float = 20) -> None:
        self.clock.now += seconds
        for release, counters in self.counters.items():
            n = seconds * rps * self.splitter.current[release] / 100  # type: ignore[index]
            quality = self.quality[release]
            counters.requests += n
            counters.errors += n * quality.error_rate
            observe(counters.ttft, quality.ttft, n)
            observe(counters.tpot, quality.tpot, n * 50)
            counters.drafted_tokens += n * 150
            counters.accepted_tokens += n * 150 * quality.acceptance

    def snapshot(self) -> MetricsSnapshot:
        if self.unavailable:
            self.unavailable -= 1
            raise ConnectionError("metrics endpoint down")
        return MetricsSnapshot.model_validate(
            {"taken_at": self.clock.now, "releases": {k: v.model_dump() for k, v in self.counters.items()}}
        )


def make_config(tmp_path: Path, verdict: str = "PASS", **changes: Any) -> RolloutConfig:
    gate = tmp_path / "gate-report.md"
    gate.write_text(f"# Release gate: {verdict}\n")
    data: dict[str, Any] = {
        "name": "demo",
        "stable": {"model": "m@v1"},
        "candidate": {"model": "m@v2", "draft": "d@v2"},
        "gate": {"path": str(gate)},
        "steps": [
            {"weight": 10, "min_duration_seconds": 300, "min_requests": 200},
            {"weight": 50, "min_duration_seconds": 300, "min_requests": 500},
            {"weight": 100, "min_duration_seconds": 300, "min_requests": 1000},
        ],
        "analysis": {
            "error_rate": {"max": 0.02, "max_increase": 0.01},
            "p99_ttft_seconds": {"max": 2.0, "max_ratio": 1.5},
            "time_per_output_token_seconds": {"max": 0.1},
            "acceptance_rate": {"min": 0.4, "max_drop": 0.15},
        },
        "rollback": {"min_requests": 50, "drain_seconds": 60, "max_metric_failures": 3},
    }
    return RolloutConfig.model_validate(data | changes)


@dataclass
class World:
    config: RolloutConfig
    clock: Clock
    splitter: Splitter
    deployer: Deployer
    gateway: Gateway
    registry: FileRegistry
    state_dir: Path

    def controller(self) -> RolloutController:
        return RolloutController(self.config, splitter=self.splitter, metrics=self.gateway,
                                 deployer=self.deployer, state_dir=self.state_dir, registry=self.registry,
                                 clock=self.clock)  # fmt: skip

    def drive(self, controller: RolloutController, ticks: int = 40, seconds: float = 60) -> RolloutPhase:
        """Tick, then let a minute of traffic flow, until the rollout ends."""
        for _ in range(ticks):
            if controller.tick().terminal:
                break
            self.gateway.flow(seconds)
        return controller.state.phase


def make_world(tmp_path: Path, candidate: Quality, verdict: str = "PASS", **changes: Any) -> World:
    clock, splitter = Clock(), Splitter()
    return World(
        config=make_config(tmp_path, verdict, **changes),
        clock=clock,
        splitter=splitter,
        deployer=Deployer(splitter),
        gateway=Gateway(splitter, clock, candidate),
        registry=FileRegistry(tmp_path / "registry"),
        state_dir=tmp_path / "state",
    )


def decisions(controller: RolloutController) -> list[str]:
    return [record["decision"] for record in controller.audit_records() if record["decision"] != "hold"]


def test_good_candidate_advances_10_50_100_and_is_promoted(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    controller = world.controller()
    assert world.drive(controller) is RolloutPhase.PROMOTED

    assert [w["candidate"] for w in world.splitter.history] == [10, 50, 100, 100, 100]
    assert world.deployer.events == [("deploy", "candidate", 0), ("remove", "stable", 0)]
    assert decisions(controller) == [
        "gate_passed", "start_step", "advance", "start_step", "advance", "start_step", "promote",
        "removed", "finished",
    ]  # fmt: skip
    for record in controller.audit_records():
        if record["decision"] in ("advance", "promote"):
            assert record["requirements"]["candidate_requests"] >= record["requirements"]["min_requests"]
            assert record["window"]["seconds"] >= 300
            assert record["checks"] and all(c["status"] in ("pass", "no_data") for c in record["checks"])
            assert record["metrics"]["candidate"]["error_rate"] == pytest.approx(0.001)
    # The report is in the registry as an immutable artifact with the whole audit log.
    state = load_state(world.state_dir)
    assert state is not None and state.report_ref == f"rollout-demo@{state.rollout_id}"
    manifest = world.registry.manifest(state.report_ref)
    assert manifest.kind == "report" and manifest.metadata["phase"] == "promoted"
    assert "m@v2" in manifest.lineage.parents and "d@v2" in manifest.lineage.parents
    published = (world.registry.fetch(state.report_ref) / "audit.jsonl").read_text()
    assert published == controller.audit_path.read_text()


@pytest.mark.parametrize(
    ("quality", "metric"),
    [
        (Quality(error_rate=0.08), "error_rate"),
        (Quality(ttft=3.0), "p99_ttft_seconds"),
        (Quality(acceptance=0.3), "acceptance_rate"),
        (Quality(tpot=0.2), "time_per_output_token_seconds"),
    ],
)
def test_bad_candidate_is_rolled_back_automatically(tmp_path: Path, quality: Quality, metric: str) -> None:
    world = make_world(tmp_path, quality)
    controller = world.controller()
    assert world.drive(controller) is RolloutPhase.ROLLED_BACK
    # Weight 10, then 0; the candidate is removed only at weight 0, after the drain; stable never touched.
    assert [w["candidate"] for w in world.splitter.history][:2] == [10, 0]
    assert world.deployer.events == [("deploy", "candidate", 0), ("remove", "candidate", 0)]
    rollback = next(r for r in controller.audit_records() if r["decision"] == "rollback")
    assert metric in rollback["reason"] and rollback["step"] == 0
    failing = [c for c in rollback["checks"] if c["status"] == "fail"]
    assert failing and {c["metric"] for c in failing} == {metric}
    removed = next(r for r in controller.audit_records() if r["decision"] == "removed")
    assert removed["weights"]["candidate"] == 0
    assert controller.state.reason.startswith("threshold failed")


def test_few_requests_do_not_trigger_a_rollback(tmp_path: Path) -> None:
    # 8% errors would fail, but the first window holds only 12 candidate requests (< rollback.min_requests).
    world = make_world(tmp_path, Quality(error_rate=0.08))
    controller = world.controller()
    controller.tick()
    world.gateway.flow(60, rps=2)
    assert controller.tick().phase is RolloutPhase.RUNNING
    hold = list(controller.audit_records())[-1]
    assert hold["decision"] == "hold" and "fewer than 50 candidate requests" in hold["reason"]


def test_manual_rollback_policy_holds_for_an_operator(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality(error_rate=0.08), rollback={"automatic": False, "min_requests": 10})
    controller = world.controller()
    assert world.drive(controller, ticks=10) is RolloutPhase.RUNNING
    assert world.splitter.current["candidate"] == 10
    assert "waiting for an operator" in list(controller.audit_records())[-1]["reason"]
    request_command(world.state_dir, "abort", "bad error rate, confirmed")
    assert world.drive(controller) is RolloutPhase.ROLLED_BACK
    assert controller.state.reason == "bad error rate, confirmed"
    assert not (world.state_dir / COMMAND_FILE).exists()


def test_gate_verdict_is_required_before_step_1(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality(), verdict="FAIL")
    controller = world.controller()
    assert controller.tick().phase is RolloutPhase.GATE_FAILED
    assert world.splitter.history == [] and world.deployer.events == []
    gate = next(r for r in controller.audit_records() if r["decision"] == "gate_failed")
    assert gate["gate"]["verdict"] == "fail" and "gate-report.md" in gate["gate"]["source"]
    assert controller.state.report_ref is not None  # the refusal is reported too


def test_unreadable_gate_report_stops_before_any_traffic(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    (tmp_path / "gate-report.md").unlink()
    controller = world.controller()
    with pytest.raises(RolloutError, match="cannot read"):
        controller.tick()
    assert controller.state.phase is RolloutPhase.PENDING and world.splitter.history == []
    assert list(controller.audit_records())[-1]["decision"] == "gate_error"


def test_restart_resumes_from_persisted_state(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    first = world.controller()
    for _ in range(8):  # through step 0 into step 1
        first.tick()
        world.gateway.flow(60)
    persisted = load_state(world.state_dir)
    assert persisted is not None and persisted.phase is RolloutPhase.RUNNING and persisted.step_index == 1
    started_at = persisted.step_started_at

    # A new process: fresh splitter (the ingress may have restarted too), same state dir and gateway.
    world.splitter.history.clear()
    second = world.controller()
    assert second.state.rollout_id == first.state.rollout_id and second.state.step_started_at == started_at
    second.tick()
    assert world.splitter.history[0] == {"stable": 50, "candidate": 50}  # weights re-published first
    assert world.drive(second) is RolloutPhase.PROMOTED
    assert [e for e in world.deployer.events if e[0] == "deploy"] == [("deploy", "candidate", 0)]
    assert "resume" in decisions(second)


def test_restart_during_rollback_finishes_the_removal(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality(error_rate=0.1))
    first = world.controller()
    for _ in range(10):
        if first.tick().phase is RolloutPhase.ROLLING_BACK:
            break
        world.gateway.flow(60)
    assert first.state.phase is RolloutPhase.ROLLING_BACK
    world.splitter.history.clear()
    second = world.controller()
    assert second.tick().phase is RolloutPhase.ROLLING_BACK  # still draining
    assert world.splitter.current == {"stable": 100, "candidate": 0}
    world.gateway.flow(60)
    assert second.tick().phase is RolloutPhase.ROLLED_BACK
    assert world.deployer.events[-1] == ("remove", "candidate", 0)


def test_metrics_outage_rolls_back_after_consecutive_failures(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    controller = world.controller()
    controller.tick()
    world.gateway.unavailable = 2
    world.gateway.flow(60)
    controller.tick()
    controller.tick()
    assert controller.state.phase is RolloutPhase.RUNNING and controller.state.metric_failures == 2
    controller.tick()  # recovered: the failure count resets
    assert controller.state.metric_failures == 0
    world.gateway.unavailable = 3
    for _ in range(3):
        controller.tick()
    assert controller.state.phase is RolloutPhase.ROLLING_BACK
    assert "3 consecutive metric failures" in controller.state.reason


def test_operator_promote_and_refusals(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    controller = world.controller()
    with pytest.raises(RolloutError, match="cannot promote a rollout that is pending"):
        controller.promote()
    controller.tick()
    (world.state_dir / COMMAND_FILE).write_text("{not json")
    assert controller.tick().phase is RolloutPhase.RUNNING
    assert "command_refused" in decisions(controller)
    request_command(world.state_dir, "promote", "looks great")
    assert world.drive(controller) is RolloutPhase.PROMOTED
    assert [w["candidate"] for w in world.splitter.history][:2] == [10, 100]
    assert world.deployer.events[-1] == ("remove", "stable", 0)
    with pytest.raises(RolloutError, match="cannot abort a rollout that is promoted"):
        controller.abort()


def test_abort_while_pending_deploys_nothing(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    controller = world.controller()
    assert controller.abort("changed our minds").phase is RolloutPhase.ABORTED
    assert world.splitter.history == [] and world.deployer.events == []
    assert controller.state.report_ref is not None
    world.controller().tick()  # a restarted controller over an ended rollout changes nothing
    assert decisions(controller) == ["abort", "finished"]


def test_report_is_published_once_the_registry_is_back(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality(), verdict="FAIL")
    controller = world.controller()
    controller.registry = None  # e.g. S3 unreachable: the end is recorded, the report waits
    assert controller.tick().phase is RolloutPhase.GATE_FAILED and controller.state.report_ref is None
    again = world.controller()
    assert again.tick().report_ref is not None
    assert decisions(again).count("finished") == 1
    assert world.registry.manifest(again.state.report_ref).metadata["phase"] == "gate_failed"


def test_state_file_is_whole_json_after_every_tick(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    controller = world.controller()
    for _ in range(5):
        controller.tick()
        world.gateway.flow(60)
        data = json.loads((world.state_dir / "state.json").read_text())
        assert data["phase"] == "running" and data["weights"]["candidate"] == 10
    assert not [p for p in world.state_dir.iterdir() if p.name.startswith(".state.json")]


def test_another_rollouts_state_dir_is_refused(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    world.controller()
    world.config = world.config.model_copy(update={"name": "other"})
    with pytest.raises(RolloutError, match="holds rollout 'demo'"):
        world.controller()


def test_window_starts_at_the_first_readable_snapshot(tmp_path: Path) -> None:
    world = make_world(tmp_path, Quality())
    world.gateway.unavailable = 1  # unreadable exactly when step 0 begins
    controller = world.controller()
    controller.tick()
    assert controller.state.window_start is None and controller.state.metric_failures == 1
    world.gateway.flow(600)  # traffic before the window opens does not count towards the step
    controller.tick()
    assert controller.state.window_start is not None
    assert controller.state.step_started_at == world.clock.now and controller.state.metric_failures == 0
    world.gateway.flow(60)
    controller.tick()
    hold = list(controller.audit_records())[-1]
    assert hold["decision"] == "hold" and hold["window"]["seconds"] == 60
    assert hold["metrics"]["candidate"]["requests"] == pytest.approx(120)


def test_a_candidate_that_fails_to_deploy_is_rolled_back_without_traffic(tmp_path: Path) -> None:
    """The candidate's engine crashes at start (the deployer raises): the rollout ends rolled back, the
    candidate never had a share of traffic, and what half-started is removed."""

    class CrashingDeployer(Deployer):
        def deploy(self, release: ReleaseName, spec: ReleaseSpec) -> None:
            super().deploy(release, spec)
            raise RolloutError(
                "deploy candidate applications: RuntimeError: Engine core initialization failed"
            )

    world = make_world(tmp_path, Quality())
    world.deployer = CrashingDeployer(world.splitter)
    controller = world.controller()
    assert world.drive(controller) is RolloutPhase.ROLLED_BACK
    assert all(w["candidate"] == 0 for w in world.splitter.history)
    assert world.deployer.events == [("deploy", "candidate", 0), ("remove", "candidate", 0)]
    assert decisions(controller)[:2] == ["gate_passed", "rollback"]
    rollback = next(r for r in controller.audit_records() if r["decision"] == "rollback")
    assert "Engine core initialization failed" in rollback["reason"]
