"""OpenTelemetry for the gateway: one span per request and metrics per tier and version.

Attribute names follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``) plus Tandem's own
(``tandem.tier``, ``tandem.version``, ``tandem.routing.reason``). With an OTLP endpoint configured, spans
and metrics go to the collector over OTLP/HTTP; the collector's Prometheus exporter turns the metric
names into ``tandem_gateway_requests_total``, ``gen_ai_server_time_to_first_token_seconds_bucket`` and
so on, which ``release/grafana/tandem-dashboard.json`` charts. Without an endpoint nothing is exported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from gateway.errors import GatewayError
from gateway.policy import TelemetryPolicy

log = logging.getLogger(__name__)

INSTRUMENTATION = "tandem.gateway"

# Metric names (OTel form); the dashboard uses their Prometheus translations. Per client request; the
# per-release, per-engine-attempt series the rollout analyses are gateway.release_metrics' (see canary.py).
REQUESTS = "tandem.gateway.requests"
ERRORS = "tandem.gateway.errors"
TOKENS = "tandem.gateway.tokens"
REDACTIONS = "tandem.gateway.redactions"
ROUTING = "tandem.gateway.routing_decisions"
# Traffic capture (gateway.capture): Prometheus tandem_capture_stored_total / tandem_capture_dropped_total.
CAPTURE_STORED = "tandem.capture.stored"
CAPTURE_DROPPED = "tandem.capture.dropped"
TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)


class GatewayTelemetry:
    """Tracer and meter providers plus the gateway's instruments; one per ingress replica.

    ``span_exporter`` / ``metric_reader`` replace the OTLP exporters (tests pass the SDK's in-memory
    ones). The providers are private to this object, not installed globally.
    """

    def __init__(
        self,
        policy: TelemetryPolicy | None = None,
        *,
        service_version: str = "",
        span_exporter: SpanExporter | None = None,
        metric_reader: MetricReader | None = None,
    ) -> None:
        self.policy = policy or TelemetryPolicy()
        endpoint = self.policy.endpoint()
        resource = Resource.create(
            {"service.name": self.policy.service_name, "service.version": service_version}
        )
        self.tracer_provider = TracerProvider(resource=resource)
        readers: list[MetricReader] = []
        if span_exporter is not None:
            self.tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        elif endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.tracer_provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces"))
            )
        if metric_reader is not None:
            readers.append(metric_reader)
        elif endpoint:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            readers.append(
                PeriodicExportingMetricReader(
                    OTLPMetricExporter(endpoint=f"{endpoint.rstrip('/')}/v1/metrics"),
                    export_interval_millis=self.policy.metric_export_interval_s * 1000,
                )
            )
        self.endpoint = endpoint
        self.metric_readers = readers
        self.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        self.tracer = self.tracer_provider.get_tracer(INSTRUMENTATION)
        meter = self.meter_provider.get_meter(INSTRUMENTATION)
        self.requests = meter.create_counter(REQUESTS, "{request}", "Requests finished, by tier and version.")
        self.errors = meter.create_counter(ERRORS, "{error}", "Requests that ended in an error, by code.")
        self.tokens = meter.create_counter(
            TOKENS, "{token}", "Prompt (input) and completion (output) tokens."
        )
        self.redactions = meter.create_counter(
            REDACTIONS, "{redaction}", "Redactions in outputs, by pattern."
        )
        self.routing = meter.create_counter(ROUTING, "{decision}", "Tier choices, by tier and reason.")
        self.capture_stored = meter.create_counter(
            CAPTURE_STORED, "{record}", "Captured exchanges de-identified and stored."
        )
        self.capture_dropped = meter.create_counter(
            CAPTURE_DROPPED,
            "{record}",
            "Sampled exchanges lost instead of stored (queue full, de-identification or storage failed), by reason.",
        )
        self.ttft = meter.create_histogram(
            TTFT, "s", "Time to first output token.", explicit_bucket_boundaries_advisory=_TTFT_BUCKETS
        )
        self.tpot = meter.create_histogram(
            TPOT,
            "s",
            "Time per output token after the first.",
            explicit_bucket_boundaries_advisory=_TPOT_BUCKETS,
        )
        log.info("event=telemetry_ready otlp_endpoint=%s", endpoint or "none")

    def start_request(self, *, operation: str, model: str | None, stream: bool = False) -> RequestTrace:
        """Open the span of one request; the caller must ``end()`` it (streams end when the body does)."""
        span = self.tracer.start_span(f"{operation} {model or ''}".strip(), kind=SpanKind.SERVER)
        span.set_attribute("gen_ai.operation.name", operation)
        span.set_attribute("gen_ai.request.stream", stream)
        if model:
            span.set_attribute("gen_ai.request.model", model)
        return RequestTrace(self, span, operation)

    @contextmanager
    def request(self, *, operation: str, model: str | None, stream: bool = False) -> Iterator[RequestTrace]:
        """``start_request`` as a context manager: an exception is recorded as the request's error."""
        trace = self.start_request(operation=operation, model=model, stream=stream)
        try:
            yield trace
        except GatewayError as exc:
            trace.set_error(exc.status, exc.code or type(exc).__name__)
            raise
        except BaseException as exc:
            trace.span.record_exception(exc)
            trace.set_error(500, "internal_error")
            raise
        finally:
            trace.end()

    def record_capture(self, stored: bool, reason: str | None = None) -> None:
        """Count one sampled exchange: stored, or dropped for ``reason`` (``tandem.capture.reason``)."""
        if stored:
            self.capture_stored.add(1)
        else:
            self.capture_dropped.add(1, {"tandem.capture.reason": reason or "unknown"})

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


class RequestTrace:
    """The span and measurements of one request; ``end()`` records the metrics once."""

    def __init__(self, telemetry: GatewayTelemetry, span: Span, operation: str) -> None:
        self.telemetry = telemetry
        self.span = span
        self.operation = operation
        self.started = time.monotonic()
        self.tier = "unknown"
        self.version = ""
        self.first_token_at: float | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.error: tuple[int, str] | None = None
        self.redaction_counts: dict[str, int] = {}
        self.ended = False

    @property
    def _labels(self) -> dict[str, str]:
        return {
            "tandem.tier": self.tier,
            "tandem.version": self.version,
            "gen_ai.operation.name": self.operation,
        }

    def set_route(self, tier: str, version: str, reason: str) -> None:
        self.tier, self.version = tier, version
        self.span.set_attribute("tandem.tier", tier)
        self.span.set_attribute("tandem.version", version)
        self.span.set_attribute("tandem.routing.reason", reason)
        self.telemetry.routing.add(1, {"tandem.tier": tier, "tandem.routing.reason": reason})

    def set_key(self, key_id: str | None) -> None:
        if key_id:
            self.span.set_attribute("tandem.api_key.id", key_id)

    def set_response_model(self, model: str) -> None:
        self.span.set_attribute("gen_ai.response.model", model)

    def first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()

    def set_usage(self, input_tokens: int | None, output_tokens: int | None) -> None:
        self.input_tokens, self.output_tokens = input_tokens, output_tokens

    def set_usage_from(self, usage: Mapping[str, Any] | None) -> None:
        """From an OpenAI ``usage`` block (``prompt_tokens``, ``completion_tokens``)."""
        if usage:
            self.set_usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))

    def set_error(self, status: int, code: str | None) -> None:
        self.error = (status, code or str(status))

    def add_redactions(self, counts: Mapping[str, int]) -> None:
        for name, count in counts.items():
            self.redaction_counts[name] = self.redaction_counts.get(name, 0) + count

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    def end(self) -> None:
        """Close the span and record the request's metrics (idempotent)."""
        if self.ended:
            return
        self.ended = True
        now = time.monotonic()
        telemetry, labels, span = self.telemetry, self._labels, self.span
        telemetry.requests.add(1, labels)
        if self.error is not None:
            status, code = self.error
            telemetry.errors.add(1, labels | {"error.type": code, "http.response.status_code": status})
            span.set_attribute("error.type", code)
            span.set_attribute("http.response.status_code", status)
            span.set_status(Status(StatusCode.ERROR, code))
        else:
            span.set_attribute("http.response.status_code", 200)
        if self.ttft_s is not None:
            telemetry.ttft.record(self.ttft_s, labels)
            span.set_attribute("tandem.ttft_s", self.ttft_s)
            if self.first_token_at is not None and self.output_tokens and self.output_tokens > 1:
                tpot = (now - self.first_token_at) / (self.output_tokens - 1)
                telemetry.tpot.record(tpot, labels)
                span.set_attribute("tandem.tpot_s", tpot)
        for token_type, count in (("input", self.input_tokens), ("output", self.output_tokens)):
            if count is not None:
                span.set_attribute(f"gen_ai.usage.{token_type}_tokens", count)
                telemetry.tokens.add(count, labels | {"gen_ai.token.type": token_type})
        for name, count in self.redaction_counts.items():
            telemetry.redactions.add(count, labels | {"tandem.redaction.pattern": name})
        if self.redaction_counts:
            span.set_attribute("tandem.redactions", sum(self.redaction_counts.values()))
        span.end()
