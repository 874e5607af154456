"""The rollout and verification job scheduler: one pool of rollout engines (Ray actors) and a few verify slots,
fed by :meth:`Scheduler.run` with a list of :class:`Job`.

A job is a ``launch`` function that returns one ``ObjectRef``: rollout jobs get an engine's actor handle,
verify jobs get ``None`` and start a Ray task. ``run`` keeps the pending jobs ordered by domain priority, then
list order, and starts every job that fits (engine capacity, the domain's quota, ``verify_slots``); it collects
results with ``ray.wait``. A failed attempt is retried after an exponential backoff without holding up other
jobs (each pending job has a "not before" time); a job that fails ``max_attempts`` times is quarantined and
reported as a :class:`JobFailure` instead of failing the batch. An engine whose actor died, or whose rollout ran
past ``rollout_timeout_seconds`` (presumed hung, so it is killed), leaves the pool and its jobs are retried on
the others; engines may join or leave from another thread while ``run`` blocks.

Hand-written rather than taken from a library: Ray's ``ray.util.ActorPool`` is a FIFO queue with one task per
actor and no retries, per-job timeouts, priorities or quotas, and Ray itself schedules tasks by resources only,
with no per-domain priority, quota or quarantine for work on an actor pool.

Ray is imported on first use, so importing this module (as the run configs do) stays fast.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from posttrain.errors import PosttrainError

if TYPE_CHECKING:
    import ray

log = logging.getLogger(__name__)

EventCallback = Callable[[dict[str, Any]], None]

# How long one pass of the loop waits for a result: bounds how late a timeout, a backoff or a joined engine is
# noticed.
_POLL_SECONDS = 0.1
_ERROR_CHARS = 200


class SchedulerConfig(BaseModel):
    """Priorities, quotas, retries and timeouts of the rollout and verification jobs."""

    model_config = ConfigDict(extra="forbid")

    priorities: dict[str, int] = Field(
        default_factory=dict,
        description="Domain (task family) -> priority; pending jobs of a higher priority start first, and a "
        "domain not listed has priority 0. Within one priority, jobs start in list order.",
    )
    quotas: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="Domain -> most jobs of that domain in flight at once (rollout and verify together); a "
        "domain not listed is unlimited.",
    )
    max_attempts: int = Field(
        3, ge=1, description="Failed attempts after which a job is quarantined (reported, not retried)."
    )
    backoff_seconds: float = Field(
        0.5, ge=0, description="Delay before the first retry; it doubles with each further failed attempt."
    )
    backoff_max_seconds: float = Field(8.0, ge=0, description="Longest delay before a retry.")
    verify_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="A verify job running longer is cancelled (its worker killed) and counts as a failed attempt.",
    )
    rollout_timeout_seconds: float = Field(
        900.0,
        gt=0,
        description="A rollout job running longer means its engine is hung: the engine is killed and leaves the "
        "pool, and its jobs are retried on the others. Also the longest wait for an engine to join when "
        "rollout jobs are pending and the pool is empty; then run() raises SchedulerError.",
    )
    verify_slots: int = Field(8, ge=1, description="Most verify jobs in flight at once.")


@dataclass(frozen=True)
class Job:
    """One unit of work: ``launch`` starts it and returns its ``ObjectRef``. Rollout jobs are launched with an
    engine's actor handle, verify jobs with ``None``. ``key`` is unique within one :meth:`Scheduler.run`."""

    key: str
    domain: str
    kind: Literal["rollout", "verify"]
    launch: Callable[[Any], ray.ObjectRef]


@dataclass(frozen=True)
class JobFailure:
    """A quarantined job: its attempts and one short error per failed attempt, oldest first."""

    key: str
    domain: str
    kind: str
    attempts: int
    errors: list[str]


class SchedulerError(PosttrainError):
    """The scheduler cannot make progress (rollout jobs but no engine) or was given an invalid batch."""


@dataclass(eq=False)
class _Engine:
    name: str
    handle: Any
    capacity: int
    in_flight: int = 0
    completed: int = 0
    failed: int = 0
    gone: str | None = None  # why it left the pool: "left", "died" or "hung"


@dataclass(eq=False)
class _Pending:
    job: Job
    rank: tuple[int, int]  # (-priority, position in the job list): the dispatch order
    not_before: float = 0.0
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    last_engine: str | None = None


@dataclass(eq=False)
class _Attempt:
    state: _Pending
    ref: Any
    started: float
    engine: _Engine | None


class Scheduler:
    """Runs batches of jobs on a pool of rollout engines; see the module docstring. Thread-safe: ``join``,
    ``leave`` and ``health`` may be called while ``run`` blocks in another thread. ``on_event`` receives plain
    JSON-able dicts (``type``: engine_joined, engine_left, job_retry, job_quarantined) in the thread that
    caused them; an exception it raises is logged and ignored."""

    def __init__(self, config: SchedulerConfig, on_event: EventCallback | None = None) -> None:
        self.config = config
        self.on_event = on_event
        self._changed = threading.Condition(threading.Lock())
        self._engines: dict[str, _Engine] = {}
        self._domain_in_flight: Counter[str] = Counter()
        self._verify_in_flight = 0
        self._in_flight = 0
        self._retries = 0
        self._quarantined = 0
        self._timeouts = 0

    # ------------------------------------------------------------------ the pool
    def join(self, name: str, handle: Any, capacity: int = 1) -> None:
        """Engine ``name`` joins the pool and may run ``capacity`` rollout jobs at once, starting now."""
        if capacity < 1:
            raise SchedulerError(f"engine {name}: capacity must be at least 1, got {capacity}")
        with self._changed:
            if name in self._engines:
                raise SchedulerError(f"engine {name} is already in the pool")
            self._engines[name] = _Engine(name, handle, capacity)
            self._changed.notify_all()
        self._emit(logging.INFO, {"type": "engine_joined", "name": name, "capacity": capacity})

    def leave(self, name: str) -> None:
        """Engine ``name`` leaves the pool (unknown names are ignored). Its jobs in flight are retried on other
        engines; each counts as a failed attempt ("engine <name> left"), so a job cannot bounce between
        departing engines forever."""
        self._remove(name, None, "left")

    def _remove(self, name: str, engine: _Engine | None, reason: str) -> None:
        """Take ``name`` out of the pool (only if it is still ``engine``, when given) and say why."""
        with self._changed:
            current = self._engines.get(name)
            if current is None or (engine is not None and current is not engine):
                return
            del self._engines[name]
            current.gone = reason
            self._changed.notify_all()
        self._emit(logging.WARNING, {"type": "engine_left", "name": name, "reason": reason})

    def health(self) -> dict[str, Any]:
        """The pool and the counters since this scheduler was made (retries, quarantined, timeouts)."""
        with self._changed:
            return {
                "engines": [
                    {
                        stat: getattr(e, stat)
                        for stat in ("name", "capacity", "in_flight", "completed", "failed")
                    }
                    for e in self._engines.values()
                ],
                "retries": self._retries,
                "quarantined": self._quarantined,
                "timeouts": self._timeouts,
                "in_flight": self._in_flight,
            }

    # ------------------------------------------------------------------ a batch
    def run(self, jobs: list[Job]) -> tuple[dict[str, Any], list[JobFailure]]:
        """Run every job to success or quarantine: the results by key (the ``ray.get`` value) and the
        quarantined jobs. Raises :class:`SchedulerError` on duplicate keys, or when rollout jobs are pending
        and the pool stays empty for ``rollout_timeout_seconds``."""
        import ray

        keys = Counter(job.key for job in jobs)
        duplicates = sorted(key for key, count in keys.items() if count > 1)
        if duplicates:
            raise SchedulerError(f"job keys must be unique within a run; repeated: {', '.join(duplicates)}")
        priorities = self.config.priorities
        pending = sorted(
            (_Pending(job, (-priorities.get(job.domain, 0), index)) for index, job in enumerate(jobs)),
            key=lambda state: state.rank,
        )
        flying: dict[Any, _Attempt] = {}
        results: dict[str, Any] = {}
        failures: list[JobFailure] = []
        empty_since: float | None = None
        try:
            while pending or flying:
                now = time.monotonic()
                self._reap_departed(flying, pending, failures)
                self._expire(flying, pending, failures, now)
                self._dispatch(pending, flying, failures, now)
                empty_since = self._check_engines(pending, empty_since, now)
                if not flying:
                    self._idle(pending)
                    continue
                ready, _ = ray.wait(list(flying), num_returns=1, timeout=_POLL_SECONDS)
                if ready:  # collect everything else already done in the same pass
                    done = set(ready)
                    rest = [ref for ref in flying if ref not in done]
                    ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0] if rest else []
                for ref in ready:
                    self._collect(flying, flying[ref], pending, results, failures)
        finally:
            for attempt in list(flying.values()):  # only left when run() raises
                self._settle(flying, attempt, None)
                if attempt.engine is None:
                    _cancel(attempt.ref)
        return results, failures

    def _dispatch(
        self, pending: list[_Pending], flying: dict[Any, _Attempt], failures: list[JobFailure], now: float
    ) -> None:
        """Start every pending job, in rank order, that is past its backoff and fits its slots."""
        quotas = self.config.quotas
        for state in list(pending):
            job = state.job
            if state.not_before > now:
                continue
            quota = quotas.get(job.domain)
            with self._changed:
                if quota is not None and self._domain_in_flight[job.domain] >= quota:
                    continue
                engine = None
                if job.kind == "rollout":
                    engine = self._free_engine(state.last_engine)
                    if engine is None:
                        continue
                    engine.in_flight += 1
                elif self._verify_in_flight >= self.config.verify_slots:
                    continue
                else:
                    self._verify_in_flight += 1
                self._domain_in_flight[job.domain] += 1
                self._in_flight += 1
            pending.remove(state)
            placeholder = _Attempt(state, None, now, engine)
            try:
                ref = job.launch(engine.handle if engine is not None else None)
            except Exception as exc:  # a launch that raises is one failed attempt, like a task that raises
                self._release(placeholder, success=False)
                self._record(state, f"launch failed: {_describe(exc)}", engine)
                self._retry_or_quarantine(state, pending, failures)
                continue
            if engine is not None:
                state.last_engine = engine.name
            flying[ref] = _Attempt(state, ref, now, engine)
            log.debug("event=job_started key=%s kind=%s engine=%s", job.key, job.kind, engine and engine.name)

    def _free_engine(self, avoid: str | None) -> _Engine | None:
        """The least loaded engine with a free slot, preferring one other than ``avoid`` (a retry's last
        engine); caller holds the lock."""
        free = [e for e in self._engines.values() if e.in_flight < e.capacity]
        if not free:
            return None
        return min(free, key=lambda e: (e.name == avoid, e.in_flight / e.capacity))

    def _collect(
        self,
        flying: dict[Any, _Attempt],
        attempt: _Attempt,
        pending: list[_Pending],
        results: dict[str, Any],
        failures: list[JobFailure],
    ) -> None:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        state, engine = attempt.state, attempt.engine
        try:
            value = ray.get(attempt.ref)
        except Exception as exc:
            self._settle(flying, attempt, None, success=False)
            # A RayTaskError wrapping an actor error came from inside the job; the engine itself is alive.
            if engine is not None and isinstance(exc, RayActorError) and not isinstance(exc, RayTaskError):
                self._record(state, f"engine {engine.name} died", None)
                self._remove(engine.name, engine, "died")
            else:
                self._record(state, _describe(exc), engine)
            self._retry_or_quarantine(state, pending, failures)
            return
        self._settle(flying, attempt, None, success=True)
        results[state.job.key] = value

    def _reap_departed(
        self, flying: dict[Any, _Attempt], pending: list[_Pending], failures: list[JobFailure]
    ) -> None:
        """Retry the jobs in flight on engines that left the pool (leave(), died, hung)."""
        for attempt in list(flying.values()):
            engine = attempt.engine
            if engine is not None and engine.gone is not None:
                self._settle(flying, attempt, f"engine {engine.name} {engine.gone}")
                self._retry_or_quarantine(attempt.state, pending, failures)

    def _expire(
        self, flying: dict[Any, _Attempt], pending: list[_Pending], failures: list[JobFailure], now: float
    ) -> None:
        """Cancel verify jobs past ``verify_timeout_seconds``; kill the engine of a rollout job past
        ``rollout_timeout_seconds`` (its other jobs are retried on the next pass)."""
        import ray

        config = self.config
        for attempt in list(flying.values()):
            engine = attempt.engine
            limit = config.rollout_timeout_seconds if engine is not None else config.verify_timeout_seconds
            if now - attempt.started <= limit:
                continue
            self._settle(flying, attempt, None, success=False)
            with self._changed:
                self._timeouts += 1
            job = attempt.state.job
            log.warning(
                "event=job_timeout key=%s kind=%s seconds=%g engine=%s",
                job.key,
                job.kind,
                limit,
                engine and engine.name,
            )
            if engine is None:
                _cancel(attempt.ref)
                self._record(attempt.state, f"timeout after {limit:g}s", None)
            else:
                self._record(attempt.state, f"timeout after {limit:g}s on engine {engine.name}", None)
                self._remove(engine.name, engine, "hung")
                try:
                    ray.kill(engine.handle)
                except Exception as exc:  # already dead, or not an actor: it is out of the pool either way
                    log.warning("event=engine_kill_failed engine=%s error=%s", engine.name, _describe(exc))
            self._retry_or_quarantine(attempt.state, pending, failures)

    def _check_engines(self, pending: list[_Pending], empty_since: float | None, now: float) -> float | None:
        """When the pool has been empty since ``empty_since`` while rollout jobs wait, and longer than
        ``rollout_timeout_seconds``, give up; returns the new ``empty_since``."""
        with self._changed:
            if self._engines or not any(state.job.kind == "rollout" for state in pending):
                return None
        if empty_since is None:
            return now
        waited = now - empty_since
        if waited > self.config.rollout_timeout_seconds:
            waiting = sum(state.job.kind == "rollout" for state in pending)
            raise SchedulerError(
                f"{waiting} rollout jobs are pending and no engine has been in the pool for {waited:.1f}s "
                f"(rollout_timeout_seconds={self.config.rollout_timeout_seconds:g})"
            )
        return empty_since

    def _idle(self, pending: list[_Pending]) -> None:
        """Nothing in flight: sleep until the next backoff ends or an engine joins (at most one poll)."""
        now = time.monotonic()
        backoffs = [state.not_before - now for state in pending if state.not_before > now]
        with self._changed:
            self._changed.wait(timeout=min([_POLL_SECONDS, *backoffs]))

    # ------------------------------------------------------------------ bookkeeping
    def _settle(
        self, flying: dict[Any, _Attempt], attempt: _Attempt, error: str | None, success: bool = False
    ) -> None:
        """Attempt ``attempt`` is over: free its slots, and record ``error`` when given."""
        flying.pop(attempt.ref, None)
        self._release(attempt, success)
        if error is not None:
            self._record(attempt.state, error, attempt.engine)

    def _release(self, attempt: _Attempt, success: bool) -> None:
        engine, domain = attempt.engine, attempt.state.job.domain
        with self._changed:
            self._in_flight -= 1
            self._domain_in_flight[domain] -= 1
            if self._domain_in_flight[domain] <= 0:
                del self._domain_in_flight[domain]
            if engine is None:
                self._verify_in_flight -= 1
            else:
                engine.in_flight -= 1
                if success:
                    engine.completed += 1
            self._changed.notify_all()

    def _record(self, state: _Pending, error: str, engine: _Engine | None) -> None:
        """One failed attempt of ``state``'s job; ``engine`` (if any) is charged with the failure."""
        state.attempts += 1
        state.errors.append(error)
        if engine is not None:
            with self._changed:
                engine.failed += 1

    def _retry_or_quarantine(
        self, state: _Pending, pending: list[_Pending], failures: list[JobFailure]
    ) -> None:
        job, config = state.job, self.config
        identity = {"key": job.key, "domain": job.domain, "kind": job.kind}
        if state.attempts >= config.max_attempts:
            failures.append(JobFailure(job.key, job.domain, job.kind, state.attempts, list(state.errors)))
            with self._changed:
                self._quarantined += 1
            self._emit(
                logging.WARNING,
                {
                    "type": "job_quarantined",
                    **identity,
                    "attempts": state.attempts,
                    "errors": list(state.errors),
                },
            )
            return
        delay = min(config.backoff_seconds * 2 ** (state.attempts - 1), config.backoff_max_seconds)
        state.not_before = time.monotonic() + delay
        bisect.insort(pending, state, key=lambda s: s.rank)
        with self._changed:
            self._retries += 1
        self._emit(
            logging.INFO,
            {
                "type": "job_retry",
                **identity,
                "attempt": state.attempts,
                "error": state.errors[-1],
                "delay": delay,
            },
        )

    def _emit(self, level: int, event: dict[str, Any]) -> None:
        """Log ``event`` as key=value pairs, then hand it to ``on_event``."""
        fields = " ".join(f"{key}={value}" for key, value in event.items() if key != "type")
        log.log(level, "event=%s %s", event["type"], fields)
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:  # a broken observer must not stop the jobs
            log.exception("event=scheduler_event_callback_failed type=%s", event.get("type"))


def _describe(exc: BaseException) -> str:
    """One short line for an exception: 'RayTaskError(ValueError): boom', 'GetTimeoutError: ...'."""
    from ray.exceptions import RayTaskError

    if isinstance(exc, RayTaskError):
        name, message = f"RayTaskError({type(exc.cause).__name__})", str(exc.cause)
    else:
        name, message = type(exc).__name__, str(exc)
    lines = message.strip().splitlines()
    return f"{name}: {lines[0][:_ERROR_CHARS]}" if lines else name


def _cancel(ref: Any) -> None:
    """Cancel a verify task and kill its worker; failure only means it already finished."""
    import ray

    try:
        ray.cancel(ref, force=True)
    except Exception as exc:
        log.debug("event=cancel_failed error=%s", _describe(exc))
