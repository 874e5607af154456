"""The per-release metrics the ingress emits and the rollout controller analyses, each declared once.

A *series* is a Prometheus counter or histogram per release and tier: the ingress records it through Ray's
metrics (exported as ``ray_<name>``) from each finished request, or the engine exports it itself (vLLM's
speculative-decoding counters). A *rollout metric* is what the rollout analyses over a window: a function of
the window's series deltas, and the kind of limit that bounds it (``upper``: higher is worse, ``lower``:
lower is worse). The rollout config's metric names and thresholds, the metrics source, the window
computation and the ingress's emission are all built from :data:`SERIES` and :data:`ROLLOUT_METRICS`, so a
new metric is one :func:`register_series` and/or one :func:`rollout_metric` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, Field

SeriesKind = Literal["counter", "histogram"]
LimitKind = Literal["upper", "lower"]
# Which labels pick a release's samples: the ingress's own `release` tag, or the engine's (configurable).
SelectorKind = Literal["release", "engine"]


@dataclass(frozen=True)
class RequestOutcome:
    """What the ingress knows about one finished request, for the series it emits."""

    server_error: bool
    ttft_s: float | None
    tpot_s: float | None


@dataclass(frozen=True)
class Series:
    """One exported counter or histogram (the controller reads ``exported``; the ingress emits ``emitted_as``)."""

    name: str
    kind: SeriesKind
    exported: str
    description: str
    emitted_as: str | None = None
    emit: Callable[[RequestOutcome], float | None] | None = None
    boundaries: tuple[float, ...] = ()
    selector: SelectorKind = "release"


class Histogram(BaseModel):
    """A cumulative Prometheus histogram: bucket upper bound (``le``, as text) -> cumulative count."""

    buckets: dict[str, float] = Field(default_factory=dict)
    sum: float = 0
    count: float = 0


class Window(Protocol):
    """A release's series over an analysis window: counter deltas and histogram deltas."""

    def counter(self, name: str) -> float: ...

    def histogram(self, name: str) -> Histogram: ...


@dataclass(frozen=True)
class RolloutMetric:
    name: str
    limit: LimitKind
    description: str
    window: Callable[[Window], float | None]


SERIES: dict[str, Series] = {}
ROLLOUT_METRICS: dict[str, RolloutMetric] = {}


def register_series(series: Series) -> Series:
    """Declare a series; ``emit`` (with ``emitted_as``) makes the ingress record it for every request."""
    if series.name in SERIES:
        raise ValueError(f"series {series.name!r} is already registered")
    if (series.emit is None) != (series.emitted_as is None):
        raise ValueError(f"series {series.name!r}: give both emit and emitted_as, or neither")
    SERIES[series.name] = series
    return series


def rollout_metric(
    name: str, *, limit: LimitKind, description: str
) -> Callable[[Callable[[Window], float | None]], Callable[[Window], float | None]]:
    """Register a window function as the rollout metric ``name`` (the key of its thresholds in the config)."""

    def register(window: Callable[[Window], float | None]) -> Callable[[Window], float | None]:
        if name in ROLLOUT_METRICS:
            raise ValueError(f"rollout metric {name!r} is already registered")
        ROLLOUT_METRICS[name] = RolloutMetric(name=name, limit=limit, description=description, window=window)
        return window

    return register


def histogram_quantile(quantile: float, histogram: Histogram) -> float | None:
    """Prometheus ``histogram_quantile``: linear interpolation inside the bucket holding the rank."""
    if histogram.count <= 0 or not histogram.buckets:
        return None
    bounds = sorted((float(le), count) for le, count in histogram.buckets.items())
    total = bounds[-1][1]
    if total <= 0:
        return None
    rank = quantile * total
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, count in bounds:
        if count >= rank:
            if upper_bound == float("inf"):
                return lower_bound  # the rank is past the last finite bucket: report its bound
            if count == lower_count:
                return upper_bound
            return lower_bound + (upper_bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = upper_bound, count
    return lower_bound


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


# ---------------------------------------------------------------------------------------------- series
register_series(Series(
    "requests", "counter", "ray_tandem_requests_total", "Counter of finished requests.",
    emitted_as="tandem_requests_total", emit=lambda outcome: 1,
))  # fmt: skip
register_series(Series(
    "errors", "counter", "ray_tandem_request_errors_total", "Counter of failed requests (5xx).",
    emitted_as="tandem_request_errors_total", emit=lambda outcome: 1 if outcome.server_error else None,
))  # fmt: skip
register_series(Series(
    "ttft", "histogram", "ray_tandem_time_to_first_token_seconds", "Histogram (base name) of time to first token.",
    emitted_as="tandem_time_to_first_token_seconds", emit=lambda outcome: outcome.ttft_s,
    boundaries=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16),
))  # fmt: skip
register_series(Series(
    "tpot", "histogram", "ray_tandem_time_per_output_token_seconds",
    "Histogram (base name) of time per output token after the first.",
    emitted_as="tandem_time_per_output_token_seconds", emit=lambda outcome: outcome.tpot_s,
    boundaries=(0.01, 0.02, 0.04, 0.08, 0.15, 0.25, 0.5, 1),
))  # fmt: skip
register_series(Series(
    "drafted_tokens", "counter", "ray_vllm_spec_decode_num_draft_tokens_total",
    "Counter of speculative tokens the fast tier's engine drafted.", selector="engine",
))  # fmt: skip
register_series(Series(
    "accepted_tokens", "counter", "ray_vllm_spec_decode_num_accepted_tokens_total",
    "Counter of drafted tokens the fast tier's engine accepted.", selector="engine",
))  # fmt: skip


# ---------------------------------------------------------------------------------------------- metrics
@rollout_metric("error_rate", limit="upper", description="Errors / requests in the window.")
def error_rate(window: Window) -> float | None:
    return _ratio(window.counter("errors"), window.counter("requests"))


@rollout_metric("p99_ttft_seconds", limit="upper", description="99th percentile time to first token.")
def p99_ttft_seconds(window: Window) -> float | None:
    return histogram_quantile(0.99, window.histogram("ttft"))


@rollout_metric(
    "time_per_output_token_seconds",
    limit="upper",
    description="Mean time per output token after the first (decode speed).",
)
def time_per_output_token_seconds(window: Window) -> float | None:
    tpot = window.histogram("tpot")
    return _ratio(tpot.sum, tpot.count)


@rollout_metric(
    "acceptance_rate", limit="lower", description="Fast tier: accepted / drafted speculative tokens."
)
def acceptance_rate(window: Window) -> float | None:
    return _ratio(window.counter("accepted_tokens"), window.counter("drafted_tokens"))
