"""Opt-in traffic capture, through the real ``RequestPipeline`` with a fake engine (no Ray, no vLLM): sampling
per key, de-identified storage, stream assembly, failures that never fail the request, and retention."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from ray.serve.llm.openai_api_models import ChatCompletionRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.capture import (
    CapturedExchange,
    PendingExchange,
    TrafficCapture,
    delete_expired,
    ensure_capture_schema,
    insert_record,
    query_records,
    read_records,
    sampled,
)
from gateway.deidentify import Deidentifier
from gateway.ingress import create_fastapi_app
from gateway.pipeline import RequestPipeline, TierTarget
from gateway.policy import CapturePolicy, GatewayPolicy, TelemetryPolicy
from gateway.telemetry import CAPTURE_DROPPED, CAPTURE_STORED, GatewayTelemetry

TARGETS = [TierTarget("standard", "tandem-standard", ("standard",), "m@v1")]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]
PROMPT = [{"role": "user", "content": "I am Zbigniew Wrobel, reach me at zb@example.com. Where is my order?"}]
ANSWER = "Dear Alice Smith, your order ships today."


@pytest.fixture(scope="module")
def deidentifier() -> Deidentifier:
    return Deidentifier()  # loads Presidio once for the module


class FakeEngine:
    """Answers like vLLM's chat endpoint: a whole body, or SSE chunks; a tool call when tools are offered."""

    async def __call__(self, body: Any, _: Request) -> Response:
        usage = {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}
        wants_tool = bool(getattr(body, "tools", None))
        if getattr(body, "stream", False):
            return StreamingResponse(
                self._stream(body.model, wants_tool, usage), media_type="text/event-stream"
            )
        message: dict[str, Any] = {"role": "assistant", "content": None if wants_tool else ANSWER}
        if wants_tool:
            message["tool_calls"] = [_call()]
        finish = "tool_calls" if wants_tool else "stop"
        return JSONResponse({"id": "c1", "object": "chat.completion", "model": body.model,
                             "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})  # fmt: skip

    async def _stream(self, model: str, wants_tool: bool, usage: dict[str, int]) -> AsyncIterator[str]:
        def event(delta: dict[str, Any], finish: str | None = None) -> str:
            chunk = {"id": "c1", "object": "chat.completion.chunk", "model": model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
            return f"data: {json.dumps(chunk)}\n\n"

        yield event({"role": "assistant", "content": ""})
        if wants_tool:
            call = _call()
            yield event({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                         "function": {"name": "lookup_", "arguments": ""}}]})  # fmt: skip
            yield event(
                {"tool_calls": [{"index": 0, "function": {"name": "order", "arguments": '{"order_id": '}}]}
            )
            yield event(
                {"tool_calls": [{"index": 0, "function": {"arguments": '"ORD-1234567"}'}}]}, "tool_calls"
            )
        else:
            for word in ANSWER.split(" "):
                yield event({"content": word + " "})
            yield event({}, "stop")
        yield f"data: {json.dumps({'id': 'c1', 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"


def _call() -> dict[str, Any]:
    return {"id": "call_1", "type": "function",
            "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": "ORD-1234567"})}}  # fmt: skip


class Gateway:
    """The gateway's FastAPI app around a ``RequestPipeline`` with keys, capture and a fake engine."""

    def __init__(
        self, tmp_path: Path, deidentifier: Deidentifier, capture: dict[str, Any] | None = None
    ) -> None:
        self.store_url = str(tmp_path / "keys.db")
        policy = GatewayPolicy.model_validate(
            {
                "auth": {"mode": "keys", "key_store": self.store_url},
                "limits": {"requests_per_minute": 10_000, "tokens_per_minute": 10_000_000},
                "capture": capture or {},
            }
        )
        self.pipeline = RequestPipeline(policy, TARGETS)
        assert self.pipeline.key_store is not None and self.pipeline.capture is not None
        self.capture: TrafficCapture = self.pipeline.capture
        self.capture.deidentifier = deidentifier
        self.engine = FakeEngine()
        app: FastAPI = create_fastapi_app(policy)

        @app.post("/v1/chat/completions")
        async def chat(body: ChatCompletionRequest, request: Request) -> Response:
            return await self.pipeline.handle(body, request, self.engine, "chat")

        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=60
        )

    def key(self, name: str, **settings: Any) -> str:
        assert self.pipeline.key_store is not None
        return self.pipeline.key_store.create(name, "tests", **settings).key

    async def chat(self, key: str, request_id: str | None = None, **extra: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} | ({"x-request-id": request_id} if request_id else {})
        payload = {"model": "standard", "messages": PROMPT, "max_tokens": 16} | extra
        return await self.client.post("/v1/chat/completions", json=payload, headers=headers)

    def records(self) -> list[CapturedExchange]:
        assert self.capture.flush(30)
        return read_records(self.store_url)


@pytest.fixture
def gateway(tmp_path: Path, deidentifier: Deidentifier) -> Iterator[Gateway]:
    instance = Gateway(tmp_path, deidentifier)
    yield instance
    instance.capture.close()


def _events(response: httpx.Response) -> list[Any]:
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", response.text[-300:]
    return [json.loads(event) for event in events[:-1]]


def _metric_points(reader: InMemoryMetricReader) -> dict[str, dict[str, float]]:
    data = reader.get_metrics_data()
    found: dict[str, dict[str, float]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    label = ",".join(f"{k}={v}" for k, v in sorted((point.attributes or {}).items()))
                    found.setdefault(metric.name, {})[label] = point.value
    return found


# -- sampling --------------------------------------------------------------------------------------
def test_sampling_is_a_reproducible_function_of_the_request_id() -> None:
    ids = [f"req-{i}" for i in range(2000)]
    assert not any(sampled(i, 0.0) for i in ids) and all(sampled(i, 1.0) for i in ids)
    chosen = [i for i in ids if sampled(i, 0.25)]
    assert chosen == [i for i in ids if sampled(i, 0.25)]
    assert 0.2 < len(chosen) / len(ids) < 0.3


async def test_capture_is_off_by_default_and_at_rate_zero(gateway: Gateway) -> None:
    default_key, zero_key = gateway.key("default"), gateway.key("zero", capture_rate=0.0)
    for key in (default_key, zero_key):
        for stream in (False, True):
            response = await gateway.chat(key, stream=stream)
            assert response.status_code == 200
    assert gateway.records() == [] and gateway.capture.stored == 0 and gateway.capture.dropped == {}


async def test_rate_one_stores_every_request_de_identified(gateway: Gateway) -> None:
    key = gateway.key("all", capture_rate=1.0)
    whole = await gateway.chat(key, "r-whole")
    streamed = await gateway.chat(key, "r-stream", stream=True)
    tool_whole = await gateway.chat(key, "r-tool", tools=TOOLS)
    tool_streamed = await gateway.chat(key, "r-tool-stream", tools=TOOLS, stream=True)
    json_mode = await gateway.chat(key, "r-json", response_format={"type": "json_object"})
    assert all(r.status_code == 200 for r in (whole, streamed, tool_whole, tool_streamed, json_mode))
    # The client's answer is the engine's (capture de-identifies only the stored copy).
    assert whole.json()["choices"][0]["message"]["content"] == ANSWER
    assert (
        "".join(
            e["choices"][0]["delta"].get("content") or "" for e in _events(streamed) if e["choices"]
        ).strip()
        == ANSWER
    )

    records = {r.request_id: r for r in gateway.records()}
    assert set(records) == {"r-whole", "r-stream", "r-tool", "r-tool-stream", "r-json"}
    assert gateway.capture.stored == 5 and gateway.capture.dropped == {}
    for request_id in ("r-whole", "r-stream"):
        record = records[request_id]
        assert record.messages == [
            {"role": "user", "content": "I am <NAME>, reach me at <EMAIL>. Where is my order?"}
        ]
        assert record.answer.strip() == "Dear <NAME>, your order ships today."
        assert record.finish_reason == "stop" and record.tool_calls is None and record.tools is None
        assert (record.model, record.tier, record.version) == ("standard", "standard", "m@v1")
        assert record.key_id.startswith("tk-")
    for request_id in ("r-tool", "r-tool-stream"):
        record = records[request_id]
        assert record.tools == TOOLS and record.answer == "" and record.finish_reason == "tool_calls"
        (call,) = record.tool_calls or []
        assert call["function"]["name"] == "lookup_order"
        assert json.loads(call["function"]["arguments"]) == {"order_id": "<ID>"}
    assert records["r-json"].response_format == {"type": "json_object"}


async def test_a_fractional_rate_stores_the_seeded_sample(gateway: Gateway) -> None:
    key = gateway.key("half", capture_rate=0.5)
    ids = [f"req-{i:03d}" for i in range(40)]
    for request_id in ids:
        assert (await gateway.chat(key, request_id)).status_code == 200
    expected = {i for i in ids if sampled(i, 0.5)}
    assert 0 < len(expected) < len(ids)
    assert {r.request_id for r in gateway.records()} == expected


async def test_the_capture_switch_in_the_policy_wins(tmp_path: Path) -> None:
    policy = GatewayPolicy.model_validate(
        {"auth": {"mode": "keys", "key_store": str(tmp_path / "k.db")}, "capture": {"enabled": False}}
    )
    assert RequestPipeline(policy, TARGETS).capture is None


# -- scopes ----------------------------------------------------------------------------------------
async def test_a_key_without_the_inference_scope_is_refused(gateway: Gateway) -> None:
    reviewer = gateway.key("reviewer", scopes=["review"])
    response = await gateway.chat(reviewer)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "scope_not_allowed" and error["type"] == "permission_error"
    assert "'inference'" in error["message"]
    both = gateway.key("both", scopes=["inference", "review"])
    assert (await gateway.chat(both)).status_code == 200


# -- failures never fail the request ---------------------------------------------------------------
class BrokenDatabase:
    """A database whose every transaction fails, as a lost PostgreSQL server does."""

    dialect, param = "sqlite", "?"

    def transaction(self, *, write: bool = False) -> Any:
        raise OSError("database is gone")


def _capture_with_metrics(
    database: Any, deidentifier: Deidentifier, **policy: Any
) -> tuple[TrafficCapture, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    telemetry = GatewayTelemetry(TelemetryPolicy(otlp_endpoint=None), metric_reader=reader)
    return TrafficCapture(
        database, CapturePolicy(**policy), deidentifier=deidentifier, telemetry=telemetry
    ), reader


async def test_a_failing_database_drops_the_record_but_answers_the_request(
    gateway: Gateway, deidentifier: Deidentifier
) -> None:
    gateway.capture.close()
    capture, reader = _capture_with_metrics(BrokenDatabase(), deidentifier)
    gateway.pipeline.capture = gateway.capture = capture
    key = gateway.key("broken", capture_rate=1.0)
    whole = await gateway.chat(key)
    streamed = await gateway.chat(key, stream=True)
    assert whole.status_code == 200 and whole.json()["choices"][0]["message"]["content"] == ANSWER
    assert streamed.status_code == 200 and _events(streamed)
    assert capture.flush(30)
    assert capture.stored == 0 and capture.dropped == {"storage_failed": 2}
    points = _metric_points(reader)
    assert points[CAPTURE_DROPPED] == {"tandem.capture.reason=storage_failed": 2}
    assert CAPTURE_STORED not in points or sum(points[CAPTURE_STORED].values()) == 0


class BlockingDeidentifier(Deidentifier):
    """Holds the writer on its first record until released, so the queue fills up."""

    def __init__(self, inner: Deidentifier) -> None:
        super().__init__()
        self.inner = inner
        self.release = threading.Event()

    def messages(self, messages: Any) -> list[dict[str, Any]]:
        self.release.wait(30)
        return self.inner.messages(messages)

    def text(self, text: str) -> str:
        return self.inner.text(text)


async def test_a_full_queue_drops_and_counts_without_waiting(
    tmp_path: Path, deidentifier: Deidentifier
) -> None:
    gateway = Gateway(tmp_path, deidentifier)
    gateway.capture.close()
    blocking = BlockingDeidentifier(deidentifier)
    capture, reader = _capture_with_metrics(gateway.pipeline.key_store.database, blocking, queue_size=1)  # type: ignore[union-attr]
    gateway.pipeline.capture = gateway.capture = capture
    key = gateway.key("busy", capture_rate=1.0)
    started = time.monotonic()
    responses = [await gateway.chat(key, f"q-{i}") for i in range(5)]
    assert time.monotonic() - started < 10  # nothing waited for the blocked writer
    assert all(r.status_code == 200 for r in responses)
    blocking.release.set()
    assert capture.flush(30)
    # One record was with the writer, one waited in the queue of one; the other three were dropped.
    assert capture.stored == 2 and capture.dropped == {"queue_full": 3}
    assert len(read_records(gateway.store_url)) == 2
    assert _metric_points(reader)[CAPTURE_DROPPED] == {"tandem.capture.reason=queue_full": 3}
    capture.close()


async def test_a_stream_cut_short_is_not_captured(gateway: Gateway) -> None:
    """A client that goes away mid-stream closes the body iterator at a yield: nothing is captured."""
    assert gateway.pipeline.key_store is not None
    record = gateway.pipeline.key_store.create("cut", "tests", capture_rate=1.0).record
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
    engine_response = await gateway.engine(
        ChatCompletionRequest(model="standard", messages=PROMPT, stream=True), Request(scope)
    )
    tapped = gateway.capture.tap(engine_response, key=record, request=Request(scope), payload={"messages": PROMPT},
                                 model="standard")  # fmt: skip
    assert isinstance(tapped, StreamingResponse)
    iterator = tapped.body_iterator
    await iterator.__anext__()  # type: ignore[attr-defined]
    await iterator.aclose()  # type: ignore[attr-defined]
    assert gateway.records() == []
    # The same stream read to its end is captured.
    engine_response = await gateway.engine(
        ChatCompletionRequest(model="standard", messages=PROMPT, stream=True), Request(scope)
    )
    tapped = gateway.capture.tap(engine_response, key=record, request=Request(scope), payload={"messages": PROMPT},
                                 model="standard")  # fmt: skip
    assert isinstance(tapped, StreamingResponse)
    pieces = [piece async for piece in tapped.body_iterator]
    assert pieces[-1] == "data: [DONE]\n\n"
    (captured,) = gateway.records()
    assert captured.answer.strip() == "Dear <NAME>, your order ships today."


# -- retention -------------------------------------------------------------------------------------
def _pending(captured_at: float, request_id: str) -> PendingExchange:
    return PendingExchange(request_id=request_id, key_id="tk-test", model="standard", request={"messages": PROMPT},
                           answer=ANSWER, tool_calls=None, finish_reason="stop", tier=None, version=None,
                           captured_at=captured_at)  # fmt: skip


def test_the_writer_deletes_records_past_retention(tmp_path: Path, deidentifier: Deidentifier) -> None:
    from gateway.database import open_database

    database = open_database(str(tmp_path / "keys.db"))
    day = 86_400.0
    now = [1_800_000_000.0]
    capture = TrafficCapture(
        database, CapturePolicy(retention_days=30), deidentifier=deidentifier, clock=lambda: now[0]
    )
    for age_days, request_id in ((45, "old"), (31, "older-than-30"), (29, "recent"), (0, "today")):
        assert capture.submit(_pending(now[0] - age_days * day, request_id))
    assert capture.flush(30)
    assert {r.request_id for r in query_records(database)} == {"old", "older-than-30", "recent", "today"}
    capture.purge_now()
    assert capture.flush(30)
    assert {r.request_id for r in query_records(database)} == {"recent", "today"}
    now[0] += 2 * day  # two days on, "recent" is 31 days old
    assert delete_expired(database, 30, now[0]) == 1
    assert {r.request_id for r in query_records(database)} == {"today"}
    capture.close()
    database.close()


def test_read_records_filters_by_window_and_refuses_a_missing_database(tmp_path: Path) -> None:
    from gateway.database import open_database
    from infra.errors import ConfigError

    url = str(tmp_path / "keys.db")
    database = open_database(url)
    ensure_capture_schema(database)
    ensure_capture_schema(database)  # idempotent
    for day in (1, 2, 3):
        insert_record(database, CapturedExchange(id=f"r{day}", captured_at=datetime(2026, 1, day, 12, tzinfo=UTC),
                                                 key_id="tk-x", model="m", messages=PROMPT, answer="a"))  # fmt: skip
    database.close()
    assert [r.id for r in read_records(url)] == ["r1", "r2", "r3"]
    window = read_records(url, since=datetime(2026, 1, 2), until=datetime(2026, 1, 3, 12, tzinfo=UTC))
    assert [r.id for r in window] == ["r2"]
    with pytest.raises(ConfigError, match="no key database"):
        read_records(str(tmp_path / "absent.db"))


def test_records_round_trip_on_both_backends(store_url: str) -> None:
    from gateway.database import open_database

    database = open_database(store_url)
    ensure_capture_schema(database)
    ensure_capture_schema(database)
    record = CapturedExchange(id="r1", captured_at=datetime(2026, 1, 1, tzinfo=UTC), key_id="tk-x", model="m",
                              messages=PROMPT, tools=TOOLS, answer="a", finish_reason="stop")  # fmt: skip
    insert_record(database, record)
    assert query_records(database) == [record]
    assert delete_expired(database, 30, datetime(2026, 3, 1, tzinfo=UTC).timestamp()) == 1
    assert query_records(database) == []
    database.close()
    assert read_records(store_url) == []
