"""Each rollout metric is declared once (gateway.release_metrics); config, windows and source follow it."""

from __future__ import annotations

from gateway.release_metrics import ROLLOUT_METRICS, SERIES, Histogram
from release.rollout import (
    AnalysisThresholds,
    LowerLimit,
    MetricsConfig,
    ReleaseCounters,
    UpperLimit,
    WindowMetrics,
    evaluate_analysis,
    window_metrics,
)


def test_every_registered_metric_has_thresholds_of_its_limit_kind_and_a_window_value() -> None:
    assert set(ROLLOUT_METRICS) == {
        "error_rate", "p99_ttft_seconds", "time_per_output_token_seconds", "acceptance_rate",
    }  # fmt: skip
    for name, metric in ROLLOUT_METRICS.items():
        annotation = str(AnalysisThresholds.model_fields[name].annotation)
        limit = UpperLimit if metric.limit == "upper" else LowerLimit
        assert limit.__name__ in annotation, (name, annotation)
        assert name in WindowMetrics.model_fields


def test_every_series_has_a_configured_name_and_a_counter() -> None:
    config, counters = MetricsConfig(), ReleaseCounters()
    for name, series in SERIES.items():
        assert getattr(config, name) == series.exported
        assert isinstance(getattr(counters, name), Histogram if series.kind == "histogram" else float)


def test_window_values_come_from_the_registered_functions() -> None:
    start = ReleaseCounters(requests=10, errors=1, drafted_tokens=100, accepted_tokens=50)
    end = ReleaseCounters(
        requests=110, errors=3, drafted_tokens=300, accepted_tokens=200,
        tpot=Histogram(buckets={"0.1": 4, "+Inf": 4}, sum=0.2, count=4),
    )  # fmt: skip
    window = window_metrics(start, end)
    assert window.requests == 100 and window.error_rate == 0.02
    assert window.acceptance_rate == 0.75 and window.time_per_output_token_seconds == 0.05
    assert window.p99_ttft_seconds is None
    thresholds = AnalysisThresholds.model_validate({"acceptance_rate": {"min": 0.8}})
    [check] = evaluate_analysis(thresholds, window, WindowMetrics())
    assert (check.metric, check.limit, check.status) == ("acceptance_rate", "min", "fail")
