"""The rollout/verification scheduler on a real local Ray: retries, quarantine, timeouts, dead and hung
engines, priorities, quotas and engines joining mid-run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from posttrain.distributed.scheduler import Job, Scheduler, SchedulerConfig, SchedulerError

pytestmark = pytest.mark.integration

FAST = {"backoff_seconds": 0.01, "backoff_max_seconds": 0.05}


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


@ray.remote(num_cpus=0, max_restarts=0)
class Engine:
    """A stand-in rollout engine: records its calls, fails or sleeps on request."""

    def __init__(self, name: str, fail_first: int = 0, sleep_seconds: float = 0.0) -> None:
        self.name = name
        self.fail_first = fail_first
        self.sleep_seconds = sleep_seconds
        self.calls: list[str] = []

    def generate(self, key: str) -> str:
        self.calls.append(key)
        if len(self.calls) <= self.fail_first:
            raise ValueError(f"flaky call {len(self.calls)}")
        time.sleep(self.sleep_seconds)
        return f"{key}@{self.name}"

    def history(self) -> list[str]:
        return self.calls


@ray.remote(num_cpus=0, max_restarts=0)
class ConcurrencyProbe:
    """An async engine that records the most calls of each domain it ever ran at once."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    async def generate(self, domain: str) -> str:
        self.now[domain] = self.now.get(domain, 0) + 1
        self.peak[domain] = max(self.peak.get(domain, 0), self.now[domain])
        await asyncio.sleep(0.3)
        self.now[domain] -= 1
        return domain

    def peaks(self) -> dict[str, int]:
        return self.peak


@ray.remote(num_cpus=0.5, max_retries=0)
def verify_ok(value: int) -> int:
    return value * 2


@ray.remote(num_cpus=0.5, max_retries=0)
def verify_boom() -> None:
    raise ValueError("boom")


@ray.remote(num_cpus=0.5, max_retries=0)
def verify_hang() -> None:
    time.sleep(60)


def ready(name: str, **options: Any) -> Any:
    """An Engine actor whose process is up, so its first job's clock does not include the actor's start."""
    handle = Engine.remote(name, **options)
    ray.get(handle.history.remote())
    return handle


def rollout(key: str, domain: str = "math") -> Job:
    return Job(key=key, domain=domain, kind="rollout", launch=lambda engine: engine.generate.remote(key))


def verify(key: str, task: Any, *args: Any) -> Job:
    return Job(key=key, domain="code", kind="verify", launch=lambda _: task.remote(*args))


def events_of(kind: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == kind]


def test_a_flaky_rollout_is_retried_and_succeeds() -> None:
    events: list[dict[str, Any]] = []
    scheduler = Scheduler(SchedulerConfig(**FAST), on_event=events.append)
    scheduler.join("e0", Engine.remote("e0", fail_first=1))

    results, failures = scheduler.run([rollout("r0")])

    assert results == {"r0": "r0@e0"}
    assert failures == []
    assert scheduler.health()["retries"] == 1
    (retry,) = events_of("job_retry", events)
    assert retry["key"] == "r0" and retry["attempt"] == 1
    assert retry["error"] == "RayTaskError(ValueError): flaky call 1"
    assert scheduler.health()["engines"] == [
        {"name": "e0", "capacity": 1, "in_flight": 0, "completed": 1, "failed": 1}
    ]


def test_a_verify_job_that_always_fails_is_quarantined_and_the_rest_succeed() -> None:
    events: list[dict[str, Any]] = []
    scheduler = Scheduler(SchedulerConfig(max_attempts=3, **FAST), on_event=events.append)

    results, failures = scheduler.run(
        [verify("v0", verify_ok, 1), verify("bad", verify_boom), verify("v1", verify_ok, 2)]
    )

    assert results == {"v0": 2, "v1": 4}
    (failure,) = failures
    assert (failure.key, failure.kind, failure.attempts) == ("bad", "verify", 3)
    assert failure.errors == ["RayTaskError(ValueError): boom"] * 3
    (quarantined,) = events_of("job_quarantined", events)
    assert quarantined == {
        "type": "job_quarantined",
        "key": "bad",
        "domain": "code",
        "kind": "verify",
        "attempts": 3,
        "errors": failure.errors,
    }
    health = scheduler.health()
    assert (health["retries"], health["quarantined"], health["in_flight"]) == (2, 1, 0)


def test_a_hanging_verify_job_is_cancelled_each_attempt_then_quarantined() -> None:
    scheduler = Scheduler(SchedulerConfig(verify_timeout_seconds=1, max_attempts=2, **FAST))
    started = time.monotonic()

    results, failures = scheduler.run([verify("hang", verify_hang)])

    assert time.monotonic() - started < 30  # the task sleeps 60 s: it was cancelled, not waited for
    assert results == {}
    (failure,) = failures
    assert failure.errors == ["timeout after 1s", "timeout after 1s"]
    assert scheduler.health()["timeouts"] == 2


def test_a_killed_engine_leaves_the_pool_and_its_job_runs_on_the_survivor() -> None:
    events: list[dict[str, Any]] = []
    scheduler = Scheduler(SchedulerConfig(**FAST), on_event=events.append)
    engines = {name: ready(name, sleep_seconds=2.0) for name in ("e0", "e1")}
    for name, handle in engines.items():
        scheduler.join(name, handle)
    outcome: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: outcome.update(result=scheduler.run([rollout("r0")])))
    runner.start()
    deadline = time.monotonic() + 30
    busy: list[str] = []
    while not busy and time.monotonic() < deadline:
        busy = [e["name"] for e in scheduler.health()["engines"] if e["in_flight"]]
        time.sleep(0.02)
    assert len(busy) == 1
    victim = busy[0]
    (survivor,) = set(engines) - {victim}
    time.sleep(0.5)  # let the call reach the actor and start sleeping
    ray.kill(engines[victim])
    runner.join(timeout=60)

    results, failures = outcome["result"]
    assert results == {"r0": f"r0@{survivor}"}
    assert failures == []
    assert events_of("engine_left", events) == [{"type": "engine_left", "name": victim, "reason": "died"}]
    (retry,) = events_of("job_retry", events)
    assert retry["error"] == f"engine {victim} died"
    assert [e["name"] for e in scheduler.health()["engines"]] == [survivor]


def test_a_hung_engine_is_killed_and_its_job_retried_elsewhere() -> None:
    events: list[dict[str, Any]] = []
    scheduler = Scheduler(SchedulerConfig(rollout_timeout_seconds=1, **FAST), on_event=events.append)
    hung = ready("e0", sleep_seconds=60.0)
    scheduler.join("e0", hung)
    scheduler.join("e1", ready("e1"))

    results, failures = scheduler.run([rollout("r0"), rollout("r1")])

    assert results == {"r0": "r0@e1", "r1": "r1@e1"}
    assert failures == []
    assert events_of("engine_left", events) == [{"type": "engine_left", "name": "e0", "reason": "hung"}]
    health = scheduler.health()
    assert health["timeouts"] == 1
    assert [e["name"] for e in health["engines"]] == ["e1"]
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(hung.history.remote(), timeout=30)


def test_higher_priority_domains_run_first() -> None:
    scheduler = Scheduler(SchedulerConfig(priorities={"high": 5}, **FAST))
    engine = Engine.remote("e0")
    scheduler.join("e0", engine, capacity=1)
    jobs = [rollout(f"low{i}", "low") for i in range(3)] + [rollout(f"high{i}", "high") for i in range(3)]

    results, _ = scheduler.run(jobs)

    assert len(results) == 6
    assert ray.get(engine.history.remote()) == ["high0", "high1", "high2", "low0", "low1", "low2"]


def test_a_domain_quota_caps_its_jobs_in_flight() -> None:
    scheduler = Scheduler(SchedulerConfig(quotas={"a": 1}, **FAST))
    probe = ConcurrencyProbe.options(max_concurrency=4).remote()
    scheduler.join("e0", probe, capacity=4)
    jobs = [
        Job(
            key=f"{domain}{i}", domain=domain, kind="rollout", launch=lambda e, d=domain: e.generate.remote(d)
        )
        for i in range(4)
        for domain in ("a", "b")
    ]

    results, failures = scheduler.run(jobs)

    assert len(results) == 8 and failures == []
    peaks = ray.get(probe.peaks.remote())
    assert peaks["a"] == 1
    assert peaks["b"] > 1  # the engine did run jobs concurrently, so the cap on "a" was the quota's doing


def test_rollout_jobs_without_any_engine_raise_instead_of_hanging() -> None:
    scheduler = Scheduler(SchedulerConfig(rollout_timeout_seconds=0.5, **FAST))
    started = time.monotonic()

    with pytest.raises(SchedulerError, match="no engine"):
        scheduler.run([rollout("r0")])

    assert time.monotonic() - started < 10
    assert scheduler.health()["in_flight"] == 0


def test_an_engine_joining_while_run_blocks_is_used() -> None:
    scheduler = Scheduler(SchedulerConfig(rollout_timeout_seconds=30, **FAST))
    engine = Engine.remote("late")
    joiner = threading.Timer(0.5, scheduler.join, args=("late", engine))
    joiner.start()

    results, failures = scheduler.run([rollout("r0"), rollout("r1")])

    joiner.join()
    assert results == {"r0": "r0@late", "r1": "r1@late"}
    assert failures == []


def test_a_failing_event_callback_does_not_stop_the_jobs() -> None:
    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("observer bug")

    scheduler = Scheduler(SchedulerConfig(**FAST), on_event=broken)
    scheduler.join("e0", Engine.remote("e0", fail_first=1))

    results, _ = scheduler.run([rollout("r0")])

    assert results == {"r0": "r0@e0"}


def test_duplicate_keys_are_refused() -> None:
    with pytest.raises(SchedulerError, match="r0"):
        Scheduler(SchedulerConfig()).run([rollout("r0"), rollout("r0")])
