"""Chaos (issue 17): a candidate whose engine crashes, at start or in the middle of its canary step, is rolled
back automatically, and no request outside the candidate's traffic share fails.

Both run a real `tandem serve` on the bundled model (its own Ray head; the helpers of test_rollout_e2e) with
streaming client load through the whole rollout, each request a new session. The split is sticky and
monotonic in the weight (``assign_release``), so a failed request whose session is not the candidate's at the
highest weight the rollout reached was a stable request: the tests count failures by share and assert that
the stable share has none, and that the stable engine replica was never replaced.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from gateway.canary import candidate_app_name
from gateway.traffic import assign_release
from infra.registry import FileRegistry
from release.rollout import RolloutConfig
from release.rollout_controller import RolloutPhase, open_controller
from release.serve_deployer import ServeDeployer
from tests.release.test_rollout_e2e import (
    CANDIDATE_DEPLOYMENT,
    STABLE_DEPLOYMENT,
    _replica_ids,
    _rollout_config,
    serve_with_candidate,
)

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.chaos_full]

SALT = "e2e"  # _rollout_config's traffic salt


@dataclass
class SessionLoad:
    """(session, status, ended with [DONE], release header) of every request; transport errors by session."""

    results: list[tuple[str, int, bool, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)

    def failures(self) -> list[str]:
        failed = [session for session, status, done, _ in self.results if status != 200 or not done]
        return failed + [session for session, _ in self.errors]

    def candidate_answers(self) -> int:
        return sum(1 for _, status, _, release in self.results if status == 200 and release == "candidate")


@contextmanager
def session_load(base_url: str, workers: int = 4) -> Iterator[SessionLoad]:
    load, stop = SessionLoad(), threading.Event()

    def client() -> None:
        with httpx.Client(base_url=base_url, timeout=180) as http:
            while not stop.is_set():
                session = uuid.uuid4().hex
                body = {"model": "standard", "stream": True, "max_tokens": 24,
                        "messages": [{"role": "user", "content": "Name three colours."}]}  # fmt: skip
                try:
                    with http.stream("POST", "/v1/chat/completions", json=body,
                                     headers={"x-session-id": session}) as response:  # fmt: skip
                        lines = [line for line in response.iter_lines() if line.strip()]
                        load.results.append(
                            (session, response.status_code, lines[-1:] == ["data: [DONE]"],
                             response.headers.get("x-tandem-release", "?"))
                        )  # fmt: skip
                except httpx.HTTPError as exc:
                    load.errors.append((session, f"{type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    try:
        yield load
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=240)


@pytest.fixture(scope="module")
def crash_registry(bundled_model_dir: Path) -> Iterator[tuple[str, FileRegistry, Path]]:
    """The bundled model as the stable release and as a good candidate, and a candidate whose weights file is
    not safetensors at all (its engine dies while loading it)."""
    work = Path(tempfile.mkdtemp(prefix="tandem-tests-rollout-crash-"))
    registry = FileRegistry(work / "registry")
    registry.publish(bundled_model_dir, "smollm2-135m-instruct", "base", kind="model")
    registry.publish(bundled_model_dir, "smollm2-135m-instruct", "v2", kind="model")
    broken = work / "broken"
    shutil.copytree(bundled_model_dir, broken, ignore=shutil.ignore_patterns("tandem-manifest.json"))
    next(broken.glob("*.safetensors")).write_bytes(b"these are not the weights you are looking for")
    registry.publish(broken, "smollm2-135m-instruct", "broken", kind="model")
    shutil.rmtree(broken)
    yield f"file://{work / 'registry'}", registry, work
    shutil.rmtree(work, ignore_errors=True)


def _drive(
    config: RolloutConfig,
    work: Path,
    registry: FileRegistry,
    on_running: Callable[[ServeDeployer], None] | None = None,
) -> tuple[RolloutPhase, str, list[dict[str, object]], set[tuple[str, int]], set[tuple[str, int]], int]:
    """Tick the controller to its end; ``on_running`` runs once, when the candidate first has traffic.
    Returns the phase, reason, audit log, stable replicas before and after, and the highest weight."""
    controller = open_controller(config, work / "state", registry=registry)
    assert isinstance(controller.deployer, ServeDeployer)
    before = _replica_ids(controller.deployer, STABLE_DEPLOYMENT, wait_s=30)
    highest, fired = 0, False
    while True:
        state = controller.tick()
        highest = max(highest, state.weights["candidate"])
        if on_running is not None and not fired and state.phase is RolloutPhase.RUNNING:
            on_running(controller.deployer)
            fired = True
        if state.terminal:
            break
        time.sleep(2)
    after = _replica_ids(controller.deployer, STABLE_DEPLOYMENT, wait_s=30)
    audit = [json.loads(line) for line in controller.audit_path.read_text().splitlines()]
    return state.phase, state.reason, audit, before, after, highest


def _stable_failures(load: SessionLoad, highest_weight: int) -> list[str]:
    return [s for s in load.failures() if assign_release(s, highest_weight, SALT) == "stable"]


def test_a_candidate_whose_engine_crashes_at_start_is_rolled_back(
    crash_registry: tuple[str, FileRegistry, Path],
    monkeypatch: pytest.MonkeyPatch,
    chaos_report: Callable[..., object],
) -> None:
    registry_url, registry, root = crash_registry
    work = root / "at-start"
    work.mkdir()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the deployer's Ray driver joins the private cluster
    with serve_with_candidate(work, registry_url, None) as gateway:
        config = _rollout_config(work, gateway, "smollm2-135m-instruct@broken")
        with session_load(gateway.base_url) as load:
            started = time.monotonic()
            phase, reason, audit, before, after, highest = _drive(config, work, registry)
            took = time.monotonic() - started
    assert phase is RolloutPhase.ROLLED_BACK, reason
    assert reason.startswith("candidate failed to deploy"), reason
    assert highest == 0  # it never had traffic
    decisions = [record["decision"] for record in audit]
    assert decisions[:3] == ["gate_passed", "rollback", "removed"], decisions
    assert load.results and not load.failures(), load.failures()[:5]
    assert before and after == before  # the stable replica was never replaced
    chaos_report(
        "candidate engine crashes at start (weights file not safetensors)",
        requests=len(load.results) + len(load.errors),
        failures=len(load.failures()),
        recovery_s=round(took, 1),
        detail=f"rolled back before any traffic; {reason[:120]}",
    )


def test_a_candidate_whose_engine_crashes_mid_canary_is_rolled_back(
    crash_registry: tuple[str, FileRegistry, Path],
    monkeypatch: pytest.MonkeyPatch,
    chaos_report: Callable[..., object],
) -> None:
    registry_url, registry, root = crash_registry
    work = root / "mid-canary"
    work.mkdir()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    killed: dict[str, float] = {}
    with serve_with_candidate(work, registry_url, None) as gateway:
        config = _rollout_config(work, gateway, "smollm2-135m-instruct@v2")
        with session_load(gateway.base_url) as load:

            def crash_candidate_engine(deployer: ServeDeployer) -> None:
                """Once the candidate has answered, SIGKILL its vLLM engine process (not the Serve replica:
                the replica lives on with a dead engine, as after a real engine crash)."""
                deadline = time.monotonic() + 60
                while load.candidate_answers() == 0 and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert load.candidate_answers() > 0, "the candidate never answered at its step-0 weight"
                app = candidate_app_name("tandem", "standard")
                (_, pid), *_ = _replica_ids(deployer, CANDIDATE_DEPLOYMENT, wait_s=30, app=app)
                engines = psutil.Process(pid).children(recursive=True)
                assert engines, f"the candidate replica {pid} has no engine process"
                for engine in engines:
                    engine.send_signal(signal.SIGKILL)
                killed["at"] = time.monotonic()
                killed["processes"] = len(engines)
                # The controller's next look must see the crash: wait for the first failed candidate request
                # (the gateway counts it as it answers), else a step whose time is up may pass on the
                # requests that completed before the kill (seen: advanced to 50 % first, then rolled back).
                while not load.failures() and time.monotonic() < killed["at"] + 60:
                    time.sleep(0.2)
                assert load.failures(), "no candidate request failed within 60 s of the engine's SIGKILL"

            phase, reason, audit, before, after, highest = _drive(
                config, work, registry, on_running=crash_candidate_engine
            )
            rolled_back_s = time.monotonic() - killed["at"]
    assert phase is RolloutPhase.ROLLED_BACK, reason
    assert "error_rate" in reason, reason
    assert highest == config.steps[0].weight  # killed at step 0; never advanced
    stable_failed = _stable_failures(load, highest)
    assert not stable_failed, f"stable-share requests failed: {stable_failed[:5]}"
    candidate_failed = len(load.failures())
    assert candidate_failed > 0  # the crash was seen, and only by the candidate's share
    assert before and after == before  # the stable replica was never replaced
    rollback = next(record for record in audit if record["decision"] == "rollback")
    assert rollback["weights"]["candidate"] == 0
    chaos_report(
        "candidate engine SIGKILLed mid-canary (step 0, weight 10)",
        requests=len(load.results) + len(load.errors),
        clean_errors=candidate_failed,
        failures=len(stable_failed),
        recovery_s=round(rolled_back_s, 1),
        detail=f"rolled back on {reason[:100]}; {candidate_failed} failed requests, all in the candidate's share",
    )
