"""Telemetry: spans with GenAI attributes, metrics per tier/version, and the Grafana dashboard."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from gateway.errors import GatewayError
from gateway.policy import TelemetryPolicy
from gateway.telemetry import ERRORS, REDACTIONS, REQUESTS, ROUTING, TOKENS, TPOT, TTFT, GatewayTelemetry

DASHBOARD = Path(__file__).resolve().parents[2] / "release" / "grafana" / "tandem-dashboard.json"


@pytest.fixture
def telemetry() -> Iterator[tuple[GatewayTelemetry, InMemorySpanExporter, InMemoryMetricReader]]:
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    instance = GatewayTelemetry(
        TelemetryPolicy(otlp_endpoint=None), service_version="v3", span_exporter=spans, metric_reader=metrics
    )
    yield instance, spans, metrics
    instance.shutdown()


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_successful_request_span_and_metrics(telemetry: Any) -> None:
    instance, spans, metrics = telemetry
    with instance.request(operation="chat", model="tandem-auto", stream=True) as trace:
        trace.set_route("fast", "v3", "auto_short_interactive")
        trace.set_key("tk-abcdefgh")
        trace.first_token()
        trace.set_usage_from({"prompt_tokens": 12, "completion_tokens": 40})
        trace.add_redactions({"email": 2})
    (span,) = spans.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert span.name == "chat tandem-auto"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "tandem-auto"
    assert attributes["gen_ai.usage.input_tokens"] == 12 and attributes["gen_ai.usage.output_tokens"] == 40
    assert attributes["tandem.tier"] == "fast" and attributes["tandem.version"] == "v3"
    assert attributes["tandem.routing.reason"] == "auto_short_interactive"
    assert attributes["tandem.api_key.id"] == "tk-abcdefgh" and attributes["tandem.redactions"] == 2
    assert attributes["tandem.ttft_s"] >= 0 and "tandem.tpot_s" in attributes
    assert span.status.status_code != StatusCode.ERROR
    assert span.resource.attributes["service.version"] == "v3"

    points = _points(metrics)
    labels = {"tandem.tier": "fast", "tandem.version": "v3", "gen_ai.operation.name": "chat"}
    (requests,) = points[REQUESTS]
    assert requests.value == 1 and dict(requests.attributes) == labels
    tokens = {p.attributes["gen_ai.token.type"]: p.value for p in points[TOKENS]}
    assert tokens == {"input": 12, "output": 40}
    assert points[TTFT][0].count == 1 and points[TPOT][0].count == 1
    assert [(p.attributes["tandem.redaction.pattern"], p.value) for p in points[REDACTIONS]] == [("email", 2)]
    (routing,) = points[ROUTING]
    assert dict(routing.attributes) == {
        "tandem.tier": "fast",
        "tandem.routing.reason": "auto_short_interactive",
    }
    assert ERRORS not in points


def test_errors_are_counted_by_code_and_mark_the_span(telemetry: Any) -> None:
    instance, spans, metrics = telemetry
    with pytest.raises(GatewayError):
        with instance.request(operation="chat", model="tandem-standard") as trace:
            trace.set_route("standard", "v3", "requested")
            raise GatewayError(429, "slow down", code="rate_limit_requests")
    with pytest.raises(RuntimeError):
        with instance.request(operation="completions", model="tandem-standard"):
            raise RuntimeError("boom")
    finished = spans.get_finished_spans()
    assert [s.status.status_code for s in finished] == [StatusCode.ERROR, StatusCode.ERROR]
    assert finished[0].attributes["error.type"] == "rate_limit_requests"
    assert finished[0].attributes["http.response.status_code"] == 429
    assert finished[1].attributes["http.response.status_code"] == 500
    assert finished[1].events[0].name == "exception"
    errors = {
        (p.attributes["error.type"], p.attributes["tandem.tier"]): p.value for p in _points(metrics)[ERRORS]
    }
    assert errors == {("rate_limit_requests", "standard"): 1, ("internal_error", "unknown"): 1}
    # No first token, no usage: no latency or token samples.
    points = _points(metrics)
    assert TTFT not in points and TOKENS not in points


def test_streamed_request_ends_once_when_the_body_ends(telemetry: Any) -> None:
    instance, spans, metrics = telemetry
    trace = instance.start_request(operation="chat", model="fast", stream=True)
    trace.set_route("fast", "v3", "requested")
    assert spans.get_finished_spans() == ()
    trace.first_token()
    trace.set_usage(5, 1)  # one output token: a TTFT sample, no TPOT
    trace.end()
    trace.end()
    assert len(spans.get_finished_spans()) == 1
    points = _points(metrics)
    assert points[REQUESTS][0].value == 1 and points[TTFT][0].count == 1 and TPOT not in points


def test_no_endpoint_exports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    silent = GatewayTelemetry(TelemetryPolicy())
    assert silent.endpoint is None and silent.metric_readers == []
    with silent.request(operation="chat", model="m"):
        pass
    silent.shutdown()


def test_otlp_endpoint_receives_traces_and_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[tuple[str, str]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append((self.path, self.headers.get("Content-Type", "")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}/")
        exporting = GatewayTelemetry(TelemetryPolicy(metric_export_interval_s=3600))
        with exporting.request(operation="chat", model="m") as trace:
            trace.set_route("standard", "v1", "requested")
        exporting.shutdown()  # flushes the batch span processor and the periodic metric reader
    finally:
        server.shutdown()
    paths = {path for path, _ in received}
    assert paths == {"/v1/traces", "/v1/metrics"}, received
    assert all(content_type == "application/x-protobuf" for _, content_type in received)


# -- dashboard --------------------------------------------------------------------------------------
def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_parses_and_charts_the_required_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "tandem-gateway" and dashboard["panels"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # Panels must not overlap on Grafana's 24-column grid.
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & area, panel["title"]
        cells |= area
    text = " ".join(_exprs(dashboard))
    for required in (
        "tandem_gateway_requests_total",
        "tandem_gateway_errors_total",
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "tandem_gateway_tokens_total",
        "ray_vllm_spec_decode_num_accepted_tokens",
        "ray_vllm_spec_decode_num_draft_tokens",
    ):
        assert required in text, required
    assert "histogram_quantile(0.5," in text and "histogram_quantile(0.99," in text
    acceptance = next(p for p in dashboard["panels"] if "acceptance" in p["title"].lower())
    expr = acceptance["targets"][0]["expr"]
    assert expr.index("num_accepted_tokens") < expr.index("/") < expr.index("num_draft_tokens")
    # Balanced parentheses and braces in every query.
    for query in _exprs(dashboard):
        for opening, closing in ("()", "{}", "[]"):
            assert query.count(opening) == query.count(closing), query


def test_dashboard_names_match_what_the_gateway_exports(telemetry: Any) -> None:
    """Record one of everything, render it as Prometheus text, and find every gateway series the
    dashboard queries (and every label it groups by) in that text."""
    prometheus = pytest.importorskip("opentelemetry.exporter.prometheus")
    from prometheus_client import REGISTRY, generate_latest

    # The reader registers a collector in prometheus_client's global registry until shutdown.
    reader = prometheus.PrometheusMetricReader()
    instance = GatewayTelemetry(TelemetryPolicy(), metric_reader=reader)
    with pytest.raises(GatewayError):
        with instance.request(operation="chat", model="m", stream=True) as trace:
            trace.set_route("fast", "v1", "spill_in_flight")
            trace.first_token()
            trace.set_usage(3, 9)
            trace.add_redactions({"email": 1})
            raise GatewayError(403, "no", code="tool_not_allowed")
    exposition = generate_latest(REGISTRY).decode()
    instance.shutdown()
    exported = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{", exposition, flags=re.MULTILINE))
    labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)=\"", exposition))
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for expr in _exprs(dashboard)
        for name in re.findall(r"\b((?:tandem|gen_ai)_[a-z_]+)\b", expr)
        if not name.startswith("gen_ai_token_type")
    }
    queried -= {"tandem_tier", "tandem_version", "tandem_routing_reason", "tandem_redaction_pattern"}
    assert queried and queried <= exported, queried - exported
    grouped = {
        label
        for expr in _exprs(dashboard)
        for group in re.findall(r"by \(([^)]*)\)", expr)
        for label in group.split(", ")
    }
    assert grouped - {"le"} <= labels, grouped - labels
