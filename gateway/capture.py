"""Opt-in traffic capture: a sampled share of a key's chat exchanges, de-identified, kept for private eval sets.

Capture is per API key (``KeyRecord.capture_rate``, 0 = off, the default) and switched as a whole by the
``gateway.capture`` policy. Whether a request is sampled is a pure function of its request id (the
``x-request-id`` header, else a fresh uuid) and the rate, so it is reproducible.

Capture never slows or fails a request. The request path only decides the sample and, once the answer is
complete (the whole JSON body, or the stream's last event), puts the raw exchange on a bounded queue without
waiting. A background writer thread de-identifies it (:mod:`gateway.deidentify`) and stores it in the
``tandem_traffic_records`` table of the key database; it also deletes records older than the retention
limit. A full queue, a failed de-identification or a failed write drops the exchange and counts it
(``tandem.capture.dropped``, by reason; stored ones are ``tandem.capture.stored``), never the request.

Readers use :func:`read_records` (``tandem traffic build-set`` does).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.database import Database, open_database
from gateway.deidentify import Deidentifier
from gateway.keys import KeyRecord
from gateway.policy import CapturePolicy
from gateway.telemetry import GatewayTelemetry
from infra.errors import ConfigError

log = logging.getLogger(__name__)

TRAFFIC_TABLE = "tandem_traffic_records"
REQUEST_ID_HEADER = "x-request-id"
_TIER_HEADER, _VERSION_HEADER = "x-tandem-tier", "x-tandem-version"
# Request fields kept beside the messages: what a replay needs to ask the same question.
_REQUEST_FIELDS = ("tools", "tool_choice", "response_format")

# pg_advisory_xact_lock key serialising concurrent schema creation of the traffic capture (Database.schema_transaction).
_SCHEMA_LOCK = 0x7A4E
_SCHEMA = [
    f"""CREATE TABLE IF NOT EXISTS {TRAFFIC_TABLE} (
        id TEXT PRIMARY KEY,
        captured_at DOUBLE PRECISION NOT NULL,
        key_id TEXT NOT NULL,
        model TEXT NOT NULL,
        record TEXT NOT NULL
    )""",
    f"CREATE INDEX IF NOT EXISTS {TRAFFIC_TABLE}_captured_at ON {TRAFFIC_TABLE} (captured_at)",
]


class CapturedExchange(BaseModel):
    """One stored exchange, already de-identified: the prompt as sent and the answer as returned."""

    id: str = Field(description="Record id (a uuid, not the request id).")
    captured_at: datetime
    key_id: str = Field(description="The key that made the request (its public id).")
    model: str = Field(description="The model id or alias the client asked for.")
    messages: list[dict[str, Any]] = Field(description="The request's chat messages (OpenAI shape).")
    tools: list[dict[str, Any]] | None = Field(None, description="The request's tool definitions, if any.")
    tool_choice: Any = None
    response_format: dict[str, Any] | None = Field(
        None, description="The request's response_format (json_object / json_schema), if any."
    )
    answer: str = Field(description="The first choice's text content ('' when it only called tools).")
    tool_calls: list[dict[str, Any]] | None = Field(
        None, description="The first choice's tool calls (OpenAI shape, arguments as JSON text)."
    )
    finish_reason: str | None = None
    request_id: str | None = None
    tier: str | None = Field(None, description="The tier that answered (x-tandem-tier).")
    version: str | None = Field(None, description="The weights that answered (x-tandem-version).")


def sampled(request_id: str, rate: float) -> bool:
    """Whether the request ``request_id`` falls in a ``rate`` sample: a hash of the id against the rate, so
    the same id always gives the same answer and a set of ids is sampled at very nearly ``rate``."""
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def ensure_capture_schema(database: Database) -> None:
    """Create the traffic table and its index (idempotent)."""
    with database.schema_transaction(_SCHEMA_LOCK) as cursor:
        for statement in _SCHEMA:
            cursor.execute(statement)


def insert_record(database: Database, record: CapturedExchange) -> None:
    p = database.param
    with database.transaction(write=True) as cursor:
        cursor.execute(
            f"INSERT INTO {TRAFFIC_TABLE} (id, captured_at, key_id, model, record) VALUES ({p}, {p}, {p}, {p}, {p})",
            (
                record.id,
                record.captured_at.timestamp(),
                record.key_id,
                record.model,
                record.model_dump_json(),
            ),
        )


def delete_expired(database: Database, retention_days: float, now: float | None = None) -> int:
    """Delete records captured more than ``retention_days`` ago; returns how many went."""
    cutoff = (time.time() if now is None else now) - retention_days * 86_400
    with database.transaction(write=True) as cursor:
        cursor.execute(f"DELETE FROM {TRAFFIC_TABLE} WHERE captured_at < {database.param}", (cutoff,))
        deleted = int(getattr(cursor, "rowcount", 0) or 0)
    if deleted:
        log.info("event=capture_expired deleted=%d retention_days=%s", deleted, retention_days)
    return deleted


def query_records(
    database: Database, *, since: datetime | None = None, until: datetime | None = None
) -> list[CapturedExchange]:
    """Records with ``since <= captured_at < until`` (either bound optional), oldest first."""
    conditions, params = [], []
    for bound, operator in ((since, ">="), (until, "<")):
        if bound is not None:
            conditions.append(f"captured_at {operator} {database.param}")
            params.append(_aware(bound).timestamp())
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    with database.transaction() as cursor:
        cursor.execute(f"SELECT record FROM {TRAFFIC_TABLE}{where} ORDER BY captured_at, id", params)
        rows = cursor.fetchall()
    return [CapturedExchange.model_validate_json(row[0]) for row in rows]


def read_records(
    database_url: str, *, since: datetime | None = None, until: datetime | None = None
) -> list[CapturedExchange]:
    """The captured exchanges in the key database at ``database_url`` (a SQLite path or ``postgresql://``
    URL) with ``since <= captured_at < until``, oldest first. Naive datetimes are taken as UTC."""
    if not database_url.startswith(("postgresql://", "postgres://")):
        path = Path(database_url.removeprefix("sqlite:///")).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"no key database at {path}: capture stores its records in the gateway's key store"
            )
    database = open_database(database_url)
    try:
        ensure_capture_schema(database)
        return query_records(database, since=since, until=until)
    finally:
        database.close()


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# -- assembling the answer ------------------------------------------------------------------------------
@dataclass
class AnswerAccumulator:
    """Rebuilds the first choice of a chat completion from its SSE events (content, tool calls, finish)."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    failed: bool = False
    _buffer: str = ""

    def feed(self, piece: str | bytes) -> None:
        self._buffer += piece.decode() if isinstance(piece, bytes) else piece
        while "\n\n" in self._buffer:
            event, self._buffer = self._buffer.split("\n\n", 1)
            data = "\n".join(line[5:].lstrip() for line in event.splitlines() if line.startswith("data:"))
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            if isinstance(chunk, dict) and "error" in chunk:
                self.failed = True
                continue
            for choice in chunk.get("choices") or []:
                if int(choice.get("index", 0)) == 0:
                    self._choice(choice)

    def _choice(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        for call in delta.get("tool_calls") or []:
            slot = self.calls.setdefault(
                int(call.get("index", 0)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function") or {}
            slot["function"]["name"] += function.get("name") or ""
            slot["function"]["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]

    def answer(self) -> tuple[str, list[dict[str, Any]] | None, str | None]:
        calls = [self.calls[index] for index in sorted(self.calls)]
        return "".join(self.content), calls or None, self.finish_reason


def answer_of(body: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]] | None, str | None]:
    """The first choice of a whole chat completion: its text, tool calls and finish reason."""
    choices = body.get("choices") or [{}]
    message = choices[0].get("message") or {}
    return message.get("content") or "", message.get("tool_calls") or None, choices[0].get("finish_reason")


# -- the capture ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PendingExchange:
    """A sampled exchange as the request path hands it over: raw, not yet de-identified."""

    request_id: str
    key_id: str
    model: str
    request: dict[str, Any]
    answer: str
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str | None
    tier: str | None
    version: str | None
    captured_at: float


_STOP = object()
_PURGE = object()


class TrafficCapture:
    """Samples, queues and (on a writer thread) de-identifies and stores chat exchanges; see the module doc.

    ``stored`` and ``dropped`` (by reason) count what happened to each sampled exchange; the same counts go
    to ``telemetry`` when given. ``clock`` is the wall clock (tests freeze it).
    """

    def __init__(
        self,
        database: Database,
        policy: CapturePolicy | None = None,
        *,
        deidentifier: Deidentifier | None = None,
        telemetry: GatewayTelemetry | None = None,
        clock: Any = time.time,
    ) -> None:
        self.database = database
        self.policy = policy or CapturePolicy()
        self.deidentifier = deidentifier or Deidentifier()
        self.telemetry = telemetry
        self.clock = clock
        self.stored = 0
        self.dropped: dict[str, int] = {}
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=self.policy.queue_size)
        self._schema_ready = False
        self._next_purge = 0.0
        self._thread = threading.Thread(target=self._run, name="tandem-capture-writer", daemon=True)
        self._thread.start()

    # -- the request path (never blocks, never raises) ------------------------------------------------
    def request_id(self, request: Request) -> str:
        return request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex

    def tap(self, response: Response, *, key: KeyRecord | None, request: Request, payload: dict[str, Any],
            model: str) -> Response:  # fmt: skip
        """``response`` unchanged, or, when this request is sampled, a response that hands its exchange to
        the writer once complete (a stream: after its last event; one cut short is not captured)."""
        try:
            if key is None or not self.policy.enabled or response.status_code != 200:
                return response
            request_id = self.request_id(request)
            if not sampled(request_id, key.capture_rate):
                return response
            base: dict[str, Any] = {
                "request_id": request_id,
                "key_id": key.key_id,
                "model": model,
                "request": {"messages": payload.get("messages") or []}
                | {name: payload[name] for name in _REQUEST_FIELDS if payload.get(name) is not None},
                "tier": response.headers.get(_TIER_HEADER),
                "version": response.headers.get(_VERSION_HEADER),
            }
            if isinstance(response, StreamingResponse):
                response.body_iterator = self._tapped_stream(response.body_iterator, base)
                return response
            answer, calls, finish = answer_of(json.loads(bytes(response.body)))
            self.submit(PendingExchange(**base, answer=answer, tool_calls=calls, finish_reason=finish,
                                        captured_at=self.clock()))  # fmt: skip
        except Exception as exc:
            self._count(False, "capture_failed")
            log.warning("event=capture_failed stage=tap error=%r", repr(exc)[:300])
        return response

    async def _tapped_stream(self, source: AsyncIterable[Any], base: dict[str, Any]) -> AsyncIterator[Any]:
        accumulator: AnswerAccumulator | None = AnswerAccumulator()
        async for piece in source:
            if accumulator is not None:
                try:
                    accumulator.feed(piece)
                except Exception as exc:
                    log.warning("event=capture_failed stage=stream error=%r", repr(exc)[:300])
                    accumulator = None
                    self._count(False, "capture_failed")
            yield piece
        # Only a stream that ran to its end gets here: a disconnect closes the generator at the yield.
        if accumulator is not None and not accumulator.failed:
            answer, calls, finish = accumulator.answer()
            self.submit(PendingExchange(**base, answer=answer, tool_calls=calls, finish_reason=finish,
                                        captured_at=self.clock()))  # fmt: skip

    def submit(self, exchange: PendingExchange) -> bool:
        """Queue ``exchange`` for the writer; False (and counted as dropped) when the queue is full."""
        try:
            self._queue.put_nowait(exchange)
        except queue.Full:
            self._count(False, "queue_full")
            log.warning("event=capture_dropped reason=queue_full queue_size=%d", self.policy.queue_size)
            return False
        return True

    # -- the writer ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._purge_if_due()
            try:
                item = self._queue.get(timeout=max(0.05, self._next_purge - self.clock()))
            except queue.Empty:
                continue
            try:
                if item is _STOP:
                    return
                if item is _PURGE:
                    self._next_purge = 0.0
                    self._purge_if_due()
                else:
                    self._store(item)
            finally:
                self._queue.task_done()

    def _store(self, exchange: PendingExchange) -> None:
        try:
            record = self.deidentified(exchange)
        except Exception as exc:
            self._count(False, "deidentify_failed")
            log.warning("event=capture_dropped reason=deidentify_failed error=%r", repr(exc)[:300])
            return
        try:
            self._ensure_schema()
            insert_record(self.database, record)
        except Exception as exc:
            self._count(False, "storage_failed")
            log.warning("event=capture_dropped reason=storage_failed error=%r", repr(exc)[:300])
            return
        self._count(True)

    def deidentified(self, exchange: PendingExchange) -> CapturedExchange:
        """The stored form of ``exchange``: every message, tool description, answer and tool call
        de-identified."""
        clean = self.deidentifier
        request = exchange.request
        return CapturedExchange(
            id=uuid.uuid4().hex,
            captured_at=datetime.fromtimestamp(exchange.captured_at, UTC),
            key_id=exchange.key_id,
            model=exchange.model,
            messages=clean.messages(request.get("messages") or []),
            tools=clean.tools(request["tools"]) if request.get("tools") else None,
            tool_choice=request.get("tool_choice"),
            response_format=request.get("response_format"),
            answer=clean.text(exchange.answer),
            tool_calls=clean.tool_calls(exchange.tool_calls) if exchange.tool_calls else None,
            finish_reason=exchange.finish_reason,
            request_id=exchange.request_id,
            tier=exchange.tier,
            version=exchange.version,
        )

    def _ensure_schema(self) -> None:
        if not self._schema_ready:
            ensure_capture_schema(self.database)
            self._schema_ready = True

    def _purge_if_due(self) -> None:
        now = self.clock()
        if now < self._next_purge:
            return
        self._next_purge = now + self.policy.purge_interval_s
        try:
            self._ensure_schema()
            delete_expired(self.database, self.policy.retention_days, now)
        except Exception as exc:
            log.warning("event=capture_purge_failed error=%r", repr(exc)[:300])

    def _count(self, stored: bool, reason: str | None = None) -> None:
        if stored:
            self.stored += 1
        else:
            self.dropped[reason or "unknown"] = self.dropped.get(reason or "unknown", 0) + 1
        if self.telemetry is not None:
            self.telemetry.record_capture(stored, reason)

    # -- lifecycle -----------------------------------------------------------------------------------
    def purge_now(self) -> None:
        """Have the writer run the retention purge next (after what is already queued)."""
        self._queue.put(_PURGE)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far is stored or dropped; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Store what is queued, then stop the writer."""
        self.flush(timeout_s)
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)
