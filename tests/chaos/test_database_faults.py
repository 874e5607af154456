"""Chaos (issue 17): the key store's database failing under the gateway's load.

1. PostgreSQL stopped (``pg_ctl stop -m fast``) while clients keep sending requests through the gateway's
   FastAPI app and real ``RequestPipeline``: every request is answered promptly, 200 while the database is
   up and a 503 with ``Retry-After`` and an OpenAI error body while it is down (the gateway fails closed);
   after ``pg_ctl start`` it answers 200 again by itself, and the rate buckets hold exactly what was served.
2. Two ingress replicas (processes) with many requests in flight each, on one SQLite file: no "database is
   locked" reaches a client, and the buckets account for every request and every settled token.
3. A SQLite file whose write lock another process keeps past the busy timeout: the same documented 503,
   and 200 again once the lock is released.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import sqlite3
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI, Request
from ray.serve.llm.openai_api_models import ChatCompletionRequest
from starlette.responses import JSONResponse, Response

from gateway.ingress import create_fastapi_app
from gateway.keys import key_id_of, open_key_store
from gateway.pipeline import RequestPipeline, TierTarget
from gateway.policy import GatewayPolicy
from tests.conftest import ChaosRecord, PostgresServer

pytestmark = pytest.mark.chaos

REQUESTS_PER_MINUTE = 1_000_000  # limits no scenario reaches: every refusal here is the database's
TOKENS_PER_MINUTE = 1_000_000_000
NOW = 1_000_000.0  # the rate limiter's clock, frozen so the buckets never refill and their levels are exact
TARGETS = [
    TierTarget("standard", "tandem-standard", ("standard",), "m@v1"),
    TierTarget("fast", "tandem-fast", ("fast",), "m@v1+ngram"),
]
CHAT = {"model": "standard", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 5}
ANSWER_WITHIN_S = 10.0  # a request not answered by then is a hang
RECOVERY_WITHIN_S = 30.0  # from `pg_ctl start` to the first 200
CLIENTS = 8
PAUSE_S = 0.01  # between one client's requests, so the load does not starve the machine's shared cores


class LocalTier:
    """The local engines: every call answers at once and uses ``max_tokens`` tokens in all."""

    async def __call__(self, body: Any, _: Request) -> Response:
        tokens = int(getattr(body, "max_tokens", None) or 1)
        usage = {"prompt_tokens": 1, "completion_tokens": tokens - 1, "total_tokens": tokens}
        message = {"role": "assistant", "content": "local"}
        return JSONResponse({"model": body.model, "choices": [{"index": 0, "message": message}], "usage": usage})  # fmt: skip


class Gateway:
    """The gateway's FastAPI app around a ``RequestPipeline`` whose key store is ``key_store``; it creates
    a key unless given one (a second replica shares the first's)."""

    def __init__(self, key_store: str, plain_key: str | None = None) -> None:
        policy = GatewayPolicy.model_validate(
            {
                "auth": {"mode": "keys", "key_store": key_store},
                "limits": {
                    "requests_per_minute": REQUESTS_PER_MINUTE,
                    "tokens_per_minute": TOKENS_PER_MINUTE,
                },
            }
        )
        self.pipeline = RequestPipeline(policy, TARGETS)
        assert self.pipeline.limiter is not None and self.pipeline.key_store is not None
        self.pipeline.limiter.clock = lambda: NOW
        self.plain_key = plain_key or self.pipeline.key_store.create("chaos", "database faults").key
        app: FastAPI = create_fastapi_app(policy)
        local = LocalTier()

        @app.post("/v1/chat/completions")
        async def chat(body: ChatCompletionRequest, request: Request) -> Response:
            return await self.pipeline.handle(body, request, local, "chat")

        self.client = httpx.AsyncClient(
            # A fault that escapes the error handlers must come back as the 500 a client would see.
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
            base_url="http://gateway",
            headers={"Authorization": f"Bearer {self.plain_key}"},
            timeout=ANSWER_WITHIN_S * 2,
        )

    async def chat(self, max_tokens: int = 5) -> httpx.Response:
        return await asyncio.wait_for(
            self.client.post("/v1/chat/completions", json=CHAT | {"max_tokens": max_tokens}), ANSWER_WITHIN_S
        )

    def levels(self) -> dict[str, float]:
        """The key's buckets as stored: requests and tokens left (settled usage included)."""
        store = self.pipeline.key_store
        assert store is not None
        p = store.database.param
        with store.database.transaction() as cursor:
            cursor.execute(
                f"SELECT kind, level FROM tandem_rate_buckets WHERE key_id = {p}",
                (key_id_of(self.plain_key),),
            )
            return {kind: float(level) for kind, level in cursor.fetchall()}

    async def close(self) -> None:
        await self.client.aclose()
        assert self.pipeline.key_store is not None
        self.pipeline.key_store.close()


def clean_refusal(response: httpx.Response) -> bool:
    """A 503 as documented: ``Retry-After`` in seconds and an OpenAI error naming the key store."""
    if response.status_code != 503 or not response.headers.get("retry-after", "").isdigit():
        return False
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return bool(error.get("message")) and (error.get("type"), error.get("code")) == (
        "server_error",
        "key_store_unavailable",
    )


@dataclass
class Answer:
    phase: str  # the database's state while the request ran: "down", or "before>stopping" across a change
    status: int | None  # None: no answer (a hang) or no HTTP response at all
    clean: bool  # a documented 503 (see clean_refusal)
    seconds: float
    answered_at: float  # time.monotonic()
    detail: str = ""


class Load:
    """``clients`` concurrent clients, each sending chat requests in a loop until ``stop()``."""

    def __init__(self, gateway: Gateway, clients: int) -> None:
        self.gateway = gateway
        self.phase = "before"
        self.answers: list[Answer] = []
        self._running = True
        self._tasks = [asyncio.create_task(self._client()) for _ in range(clients)]

    async def _client(self) -> None:
        while self._running:
            phase, started = self.phase, time.monotonic()
            try:
                response = await self.gateway.chat()
                status, clean, detail = response.status_code, clean_refusal(response), response.text[:300]
            except Exception as exc:  # a hang (TimeoutError) or a transport failure: no answer at all
                status, clean, detail = None, False, repr(exc)[:300]
            now = time.monotonic()
            phase = phase if phase == self.phase else f"{phase}>{self.phase}"
            self.answers.append(Answer(phase, status, clean, now - started, now, detail))
            await asyncio.sleep(PAUSE_S)

    def count(self, phase: str, status: int | None = None) -> int:
        return sum(1 for a in self.answers if a.phase == phase and (status is None or a.status == status))

    async def until(self, what: str, condition: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not after {timeout_s}s; answers by phase: {self.summary()}")
            await asyncio.sleep(0.02)

    def summary(self) -> dict[str, dict[str, int]]:
        table: dict[str, Counter[str]] = {}
        for answer in self.answers:
            table.setdefault(answer.phase, Counter())[str(answer.status)] += 1
        return {phase: dict(counts) for phase, counts in table.items()}

    async def stop(self) -> None:
        self._running = False
        await asyncio.gather(*self._tasks)


def _wrong(answer: Answer) -> bool:
    """An answer the phase does not allow: only 200 while the database is up, only the documented 503
    while it is down, either while it stops or starts (or across a change); never a 500, a hang or a
    malformed error."""
    allowed = {"before": (True, False), "after": (True, False), "down": (False, True)}
    ok, refused = allowed.get(answer.phase, (True, True))
    return not ((ok and answer.status == 200) or (refused and answer.clean))


# -- 1. PostgreSQL stopped under load ---------------------------------------------------------------
async def test_postgres_stopped_under_load_fails_closed_and_recovers(
    postgres_server: PostgresServer,
    postgres_database_url: str,
    chaos_report: Callable[..., ChaosRecord],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    gateway = Gateway(postgres_database_url)
    load = Load(gateway, CLIENTS)
    running = True
    try:
        await load.until("24 answers before the fault", lambda: len(load.answers) >= 24, 30)
        load.phase = "stopping"
        await asyncio.to_thread(postgres_server.stop, "fast")
        running = False
        load.phase = "down"
        await load.until("48 answers while PostgreSQL is down", lambda: load.count("down") >= 48, 30)
        load.phase = "starting"
        restarted = time.monotonic()
        await asyncio.to_thread(postgres_server.start)
        running = True
        db_start_s = time.monotonic() - restarted
        load.phase = "after"
        await load.until("24 answers of 200 after the restart", lambda: load.count("after", 200) >= 24, 30)
    finally:
        await load.stop()
        if not running:
            postgres_server.start()  # the session's other tests need their server back
    levels = gateway.levels()
    await gateway.close()

    answers = load.answers
    during = [a for a in answers if a.phase not in ("before", "after")]
    wrong = [a for a in answers if _wrong(a)]
    first_ok = min(a.answered_at for a in answers if a.answered_at > restarted and a.status == 200)
    recovery_s = first_ok - restarted
    served = sum(1 for a in answers if a.status == 200)
    # A request answered while its usage could not be settled stays charged its whole reservation.
    unsettled = [
        cast(tuple[str, int, int], r.args)
        for r in caplog.records
        if r.getMessage().startswith("event=usage_settle_failed")
    ]
    overcharge = sum(reserved - actual for _, reserved, actual in unsettled)
    chaos_report(
        "PostgreSQL key store stopped (pg_ctl stop -m fast) under 8 concurrent clients, then restarted",
        requests=len(during),
        clean_errors=sum(1 for a in during if a.clean),
        failures=len(wrong),
        recovery_s=round(recovery_s, 2),
        detail=(
            f"fail closed: 503 key_store_unavailable + Retry-After while down; answers by phase "
            f"{load.summary()}; slowest answer {max(a.seconds for a in answers):.2f}s; "
            f"recovery measured from `pg_ctl start` (which took {db_start_s:.2f}s) to the first 200"
        ),
        extra={"total_requests": len(answers), "served": served, "unsettled_after_answer": len(unsettled)},
    )
    assert not wrong, [(a.phase, a.status, a.detail) for a in wrong[:5]]
    assert load.count("down") == load.count("down", 503) >= 48
    assert max(a.seconds for a in answers) < ANSWER_WITHIN_S
    assert recovery_s < RECOVERY_WITHIN_S
    # The buckets hold exactly what was served: one request each, and 5 tokens each once settled.
    assert levels["requests"] == REQUESTS_PER_MINUTE - served
    assert levels["tokens"] == TOKENS_PER_MINUTE - 5 * served - overcharge


# -- 2. two replicas on one SQLite file ---------------------------------------------------------------
REPLICAS = 2
REQUESTS_PER_REPLICA = 500
IN_FLIGHT_PER_REPLICA = 16
REPLICA_WITHIN_S = 120.0  # a replica's whole load; it takes seconds


class _EventCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.events: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.events[record.getMessage().partition(" ")[0]] += 1


async def _replica_load(gateway: Gateway) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    settled = 0
    next_request = iter(range(REQUESTS_PER_REPLICA))

    async def client() -> None:
        nonlocal settled
        for number in next_request:
            tokens = 1 + number % 7
            try:
                response = await gateway.chat(max_tokens=tokens)
            except Exception as exc:
                statuses["none"] += 1
                failures.append(repr(exc)[:300])
                continue
            statuses[str(response.status_code)] += 1
            if response.status_code == 200:
                settled += tokens
            elif not clean_refusal(response):
                failures.append(f"{response.status_code} {response.text[:300]}")

    await asyncio.gather(*(client() for _ in range(IN_FLIGHT_PER_REPLICA)))
    await gateway.close()
    return {"statuses": dict(statuses), "failures": failures, "settled_tokens": settled}


def _replica(url: str, plain_key: str, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    events = _EventCounter()
    logging.getLogger("gateway").addHandler(events)
    started = time.monotonic()
    try:
        outcome = asyncio.run(_replica_load(Gateway(url, plain_key)))
    except BaseException:
        results.put({"crashed": traceback.format_exc()})
        raise
    results.put(outcome | {"events": dict(events.events), "seconds": time.monotonic() - started})


def test_two_replicas_on_one_sqlite_file_lose_no_usage(
    tmp_path: Path, chaos_report: Callable[..., ChaosRecord]
) -> None:
    url = str(tmp_path / "keys.db")
    store = open_key_store(url)
    created = store.create("chaos", "database faults")
    store.close()
    context = multiprocessing.get_context("fork")  # the gateway's imports take seconds; a fork has them
    results = context.Queue()
    replicas = [context.Process(target=_replica, args=(url, created.key, results)) for _ in range(REPLICAS)]
    for replica in replicas:
        replica.start()
    try:
        outcomes = [results.get(timeout=REPLICA_WITHIN_S) for _ in replicas]
    except queue.Empty:
        for replica in replicas:
            replica.kill()
        pytest.fail(
            f"a replica did not report within {REPLICA_WITHIN_S}s (a hang); exit codes {[r.exitcode for r in replicas]}"
        )
    for replica in replicas:
        replica.join(timeout=60)
    assert not [o["crashed"] for o in outcomes if "crashed" in o], [
        o["crashed"] for o in outcomes if "crashed" in o
    ]
    assert [replica.exitcode for replica in replicas] == [0] * REPLICAS

    statuses: Counter[str] = sum((Counter(o["statuses"]) for o in outcomes), Counter())
    events: Counter[str] = sum((Counter(o["events"]) for o in outcomes), Counter())
    failures = [failure for o in outcomes for failure in o["failures"]]
    served, settled = statuses["200"], sum(o["settled_tokens"] for o in outcomes)
    store = open_key_store(url)
    p = store.database.param
    with store.database.transaction() as cursor:
        cursor.execute(
            f"SELECT kind, level FROM tandem_rate_buckets WHERE key_id = {p}", (created.record.key_id,)
        )
        levels = {kind: float(level) for kind, level in cursor.fetchall()}
    store.close()
    chaos_report(
        f"{REPLICAS} ingress replicas (processes), {IN_FLIGHT_PER_REPLICA} requests in flight each, on one SQLite file",
        requests=sum(statuses.values()),
        clean_errors=statuses["503"],
        failures=len(failures) + events["event=usage_settle_failed"],
        detail=(
            f"statuses {dict(statuses)}; SQLite lock timeouts {events['event=key_store_unavailable']}; "
            f"settled {settled} tokens; slowest replica {max(o['seconds'] for o in outcomes):.1f}s"
        ),
        extra={"served": served, "settled_tokens": settled},
    )
    assert not failures, failures[:5]
    assert sum(statuses.values()) == REPLICAS * REQUESTS_PER_REPLICA
    assert events["event=usage_settle_failed"] == 0
    # Nothing lost: every request served took one from the requests bucket, and every token it used.
    assert levels["requests"] == REQUESTS_PER_MINUTE - served
    assert levels["tokens"] == TOKENS_PER_MINUTE - settled


# -- 3. a SQLite write lock held past the busy timeout ----------------------------------------------
async def test_sqlite_lock_held_past_the_busy_timeout_is_a_clean_503(
    tmp_path: Path, chaos_report: Callable[..., ChaosRecord]
) -> None:
    url = str(tmp_path / "keys.db")
    gateway = Gateway(url)
    assert gateway.pipeline.key_store is not None
    database = gateway.pipeline.key_store.database
    # Connections opened from now on (the request threads') wait 0.2 s for a lock, not the default 30 s.
    database.busy_timeout_s = 0.2  # type: ignore[attr-defined]
    assert (await gateway.chat()).status_code == 200
    database.close()  # the request threads reopen, with the short timeout
    holder = sqlite3.connect(url, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another replica's write transaction that does not end
    try:
        locked = [await gateway.chat() for _ in range(5)]
    finally:
        holder.rollback()
        holder.close()
    released = time.monotonic()
    after = await gateway.chat()
    recovery_s = time.monotonic() - released
    levels = gateway.levels()
    await gateway.close()
    clean = [response for response in locked if clean_refusal(response)]
    chaos_report(
        "SQLite key store write-locked by another connection past the busy timeout (0.2 s)",
        requests=len(locked),
        clean_errors=len(clean),
        failures=len(locked) - len(clean) + (after.status_code != 200),
        recovery_s=round(recovery_s, 2),
        detail=f"fail closed: 503 key_store_unavailable, Retry-After {locked[0].headers.get('retry-after')}",
    )
    assert len(clean) == len(locked), [(r.status_code, r.text[:200]) for r in locked]
    assert after.status_code == 200, after.text
    # Only the two requests served were charged: a refused one debits nothing.
    assert levels["requests"] == REQUESTS_PER_MINUTE - 2
