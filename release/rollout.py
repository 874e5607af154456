"""Rollout configuration (``release/rollout.yaml``): steps, analysis, gate, traffic and metrics.

A rollout moves traffic from the *stable* release to a *candidate* release in steps. Each step holds a
traffic weight until its minimum duration and request count are met and the candidate's window metrics
stay within the analysis thresholds, compared with the stable release over the same window. The eval
gate report must say "pass" before the first step. The controller that executes this lives in
``release.rollout_controller``; this module only declares and validates what it executes. The sticky
split itself (:class:`TrafficWeights`) belongs to the ingress that applies it (``gateway.traffic``).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from gateway.release_metrics import (
    ROLLOUT_METRICS,
    SERIES,
    Histogram,
    LimitKind,
)
from gateway.traffic import (
    RELEASES,
    ReleaseName,
    ReleaseSpec,
    check_ref,
)
from infra.config import load_model_file

DEFAULT_ROLLOUT_PATH = Path(__file__).resolve().parent / "rollout.yaml"


# ---------------------------------------------------------------------------------------------- config
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UpperLimit(_Strict):
    """Limits on a metric where higher is worse (error rate, latency). Unset limits are not checked."""

    max: float | None = Field(None, ge=0, description="Absolute ceiling for the candidate's value.")
    max_increase: float | None = Field(None, ge=0, description="Candidate minus stable may not exceed this.")
    max_ratio: float | None = Field(None, gt=0, description="Candidate / stable may not exceed this.")

    @model_validator(mode="after")
    def _some_limit(self) -> UpperLimit:
        if self.max is None and self.max_increase is None and self.max_ratio is None:
            raise ValueError("set at least one of max, max_increase, max_ratio")
        return self


class LowerLimit(_Strict):
    """Limits on a metric where lower is worse (the fast tier's draft acceptance rate)."""

    min: float | None = Field(None, ge=0, description="Absolute floor for the candidate's value.")
    max_drop: float | None = Field(None, ge=0, description="Stable minus candidate may not exceed this.")
    min_ratio: float | None = Field(None, gt=0, description="Candidate / stable must be at least this.")

    @model_validator(mode="after")
    def _some_limit(self) -> LowerLimit:
        if self.min is None and self.max_drop is None and self.min_ratio is None:
            raise ValueError("set at least one of min, max_drop, min_ratio")
        return self


_LIMIT_MODELS: dict[LimitKind, type[BaseModel]] = {"upper": UpperLimit, "lower": LowerLimit}

# One optional field per registered rollout metric (gateway.release_metrics.ROLLOUT_METRICS).
_ThresholdFields: Any = create_model(  # type: ignore[call-overload]
    "_ThresholdFields",
    __base__=_Strict,
    **{
        name: (_LIMIT_MODELS[metric.limit] | None, Field(None, description=metric.description))
        for name, metric in ROLLOUT_METRICS.items()
    },
)


class AnalysisThresholds(_ThresholdFields):
    """What the candidate's window metrics must satisfy, per rollout metric; unset metrics are not analysed."""

    def merged(self, override: AnalysisThresholds | None) -> AnalysisThresholds:
        """These thresholds with every metric the override sets replaced by the override's."""
        if override is None:
            return self
        return self.model_copy(update={name: getattr(override, name) for name in override.model_fields_set})


class RolloutStep(_Strict):
    weight: int = Field(ge=1, le=100, description="Percent of sticky keys sent to the candidate.")
    min_duration_seconds: float = Field(0, ge=0, description="Least time the step holds before advancing.")
    min_requests: int = Field(0, ge=0, description="Least candidate requests in the step's window.")
    analysis: AnalysisThresholds | None = Field(
        None, description="Per-metric overrides of the rollout's default analysis for this step."
    )


class GateRequirement(_Strict):
    """The eval gate report that must pass before step 1: a local file or a file inside a registry artifact.

    ``tandem gate`` writes its :class:`~evalsuite.gate.GateVerdict` as ``verdict.json`` beside
    ``gate-report.md``; that model is what is read, whether ``path``/``file`` names it, the report beside
    it or (``path``) the report directory. Reports without one (other gates, older runs) are read as before:
    JSON at ``verdict_field`` (a dotted path; ``true`` or ``"pass"`` pass), Markdown on a
    ``# Release gate: PASS`` heading.
    """

    path: Path | None = Field(
        None, description="Local gate verdict.json, report (.json or .md) or the directory holding them."
    )
    ref: str | None = Field(None, description="Registry ref of a report artifact holding the gate report.")
    file: str = Field("gate-report.md", description="With `ref`: the report's path inside the artifact.")
    verdict_field: str = Field("passed", description="JSON reports: dotted path of the verdict.")

    @model_validator(mode="after")
    def _one_source(self) -> GateRequirement:
        if (self.path is None) == (self.ref is None):
            raise ValueError("set exactly one of `path` (a local report) or `ref` (a registry artifact)")
        if self.ref is not None:
            check_ref(self.ref)
        return self


class RollbackPolicy(_Strict):
    automatic: bool = Field(
        True, description="Roll back as soon as a threshold fails; false: hold and wait for an operator."
    )
    min_requests: int = Field(
        20, ge=1, description="Candidate requests a window needs before a failing threshold is trusted."
    )
    drain_seconds: float = Field(
        30, ge=0, description="Wait after moving a release's weight to 0 before removing it (in-flight work)."
    )
    max_metric_failures: int = Field(
        3, ge=1, description="Consecutive failed metric reads after which the rollout rolls back."
    )


class TrafficConfig(_Strict):
    salt: str = Field("tandem", description="Salt of the sticky hash; change it to reshuffle clients.")
    weights_file: Path = Field(
        Path("rollout-state/weights.json"),
        description="Where the controller publishes weights for the ingress.",
    )


def _by_release_label() -> dict[ReleaseName, dict[str, str]]:
    return {"stable": {"release": "stable"}, "candidate": {"release": "candidate"}}


class _MetricsConfig(_Strict):
    """Where and what the controller reads from the gateway's Prometheus ``/metrics``.

    The gateway records ``tandem_*`` with ``ray.util.metrics`` (tagged ``release``, ``tier``); Ray exports
    application metrics with a ``ray_`` prefix, hence the defaults.
    """

    urls: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000/metrics"],
        min_length=1,
        description="Prometheus text endpoints, summed: list every node's metrics export when Ray metrics are "
        "per node (several ingress replicas), so a scrape never sees only part of the counters. A single "
        "string is accepted.",
    )
    timeout_seconds: float = Field(5.0, gt=0)
    release_selectors: dict[ReleaseName, dict[str, str]] = Field(
        default_factory=_by_release_label,
        description="Labels that pick each release's request/latency samples (summed over the rest).",
    )
    acceptance_selectors: dict[ReleaseName, dict[str, str]] | None = Field(
        None,
        description="Labels that pick each release's fast-tier engine samples; default: release_selectors.",
    )

    @field_validator("urls", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _both_releases(self) -> _MetricsConfig:
        for field in ("release_selectors", "acceptance_selectors"):
            selectors = getattr(self, field)
            if selectors is not None and set(selectors) != set(RELEASES):
                raise ValueError(f"{field} needs exactly the keys 'stable' and 'candidate'")
        return self


# One Prometheus name per registered series (gateway.release_metrics.SERIES), defaulting to Ray's export.
_SeriesNames: Any = create_model(  # type: ignore[call-overload]
    "_SeriesNames",
    __base__=_MetricsConfig,
    **{
        name: (str, Field(series.exported, description=series.description)) for name, series in SERIES.items()
    },
)


class MetricsConfig(_SeriesNames):
    __doc__ = _MetricsConfig.__doc__


class DeploymentCommands(_Strict):
    """How a release's tiers are deployed and removed.

    ``deployer`` names a factory ``module:attribute`` that builds a Deployer from the rollout config and
    reads its own settings from ``options``; ``release.serve_deployer:ServeDeployer`` updates a running
    ``tandem serve`` application in place. Without it the ``deploy`` / ``remove`` argv lists run
    (``kubectl apply``, ``serve deploy``...) with ``{release}``, ``{model}`` and ``{draft}`` substituted;
    with neither, the release's tiers are managed outside the controller, which then only moves traffic.
    """

    deployer: str | None = Field(
        None, description="Import path 'module:attribute' of a Deployer factory; unset: the commands."
    )
    options: dict[str, Any] = Field(default_factory=dict, description="Settings the deployer validates.")
    deploy: list[str] | None = None
    remove: list[str] | None = None
    timeout_seconds: float = Field(600, gt=0)

    @field_validator("deployer")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[\w.]+:[\w.]+", value):
            raise ValueError(f"expected 'module:attribute', got {value!r}")
        return value


class RolloutConfig(_Strict):
    """Everything ``tandem rollout`` executes, parsed from ``release/rollout.yaml``."""

    name: str = Field(
        description="Rollout name: the registry artifact of its audit report is 'rollout-<name>'."
    )
    stable: ReleaseSpec
    candidate: ReleaseSpec
    steps: list[RolloutStep] = Field(min_length=1, description="Increasing weights ending at 100.")
    analysis: AnalysisThresholds = Field(default_factory=AnalysisThresholds)
    gate: GateRequirement
    rollback: RollbackPolicy = Field(default_factory=RollbackPolicy)
    traffic: TrafficConfig = Field(default_factory=TrafficConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    deployment: DeploymentCommands = Field(default_factory=DeploymentCommands)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,119}", value):
            raise ValueError("use lowercase letters, digits, '.', '_' or '-' (at most 120 characters)")
        return value

    @field_validator("steps")
    @classmethod
    def _increasing_to_100(cls, steps: list[RolloutStep]) -> list[RolloutStep]:
        weights = [step.weight for step in steps]
        for before, after in itertools.pairwise(weights):
            if after <= before:
                raise ValueError(f"weights must be strictly increasing, got {weights}")
        if weights[-1] != 100:
            raise ValueError(f"the last step's weight must be 100, got {weights}")
        return steps

    @model_validator(mode="after")
    def _distinct_releases(self) -> RolloutConfig:
        if self.stable == self.candidate:
            raise ValueError("candidate: is identical to stable; nothing to roll out")
        return self

    def thresholds(self, step_index: int) -> AnalysisThresholds:
        """The effective analysis of one step: the defaults with the step's overrides applied."""
        return self.analysis.merged(self.steps[step_index].analysis)


def load_rollout_config(path: Path | None = None) -> RolloutConfig:
    """Parse ``path`` (default ``release/rollout.yaml``); a ConfigError names the file and field."""
    return load_model_file(Path(path or DEFAULT_ROLLOUT_PATH), RolloutConfig)


# ---------------------------------------------------------------------------------------------- analysis
class _WindowMetrics(BaseModel):
    @model_validator(mode="after")
    def _derive(self) -> _WindowMetrics:
        # Metrics not given are computed from the counter deltas given (histograms: none in this form).
        window = _CounterWindow(
            {name: getattr(self, name) for name in SERIES if SERIES[name].kind == "counter"}
        )
        for name, metric in ROLLOUT_METRICS.items():
            if getattr(self, name) is None:
                setattr(self, name, metric.window(window))
        return self


_WindowFields: Any = create_model(  # type: ignore[call-overload]
    "_WindowFields",
    __base__=_WindowMetrics,
    **{name: (float, 0.0) for name, series in SERIES.items() if series.kind == "counter"},
    **{name: (float | None, Field(None, description=m.description)) for name, m in ROLLOUT_METRICS.items()},
)


class WindowMetrics(_WindowFields):
    """One release's traffic over an analysis window: each counter series' delta, each rollout metric's value."""

    if TYPE_CHECKING:  # the field the controller's step requirements read (fields come from the registry)
        requests: float


CheckStatus = Literal["pass", "fail", "no_data"]


class ThresholdCheck(BaseModel):
    """One limit applied to one metric: the evidence behind an advance or a rollback."""

    metric: str
    limit: str
    threshold: float
    candidate: float | None
    stable: float | None
    status: CheckStatus
    detail: str


# limit name -> (is relative to stable, passes(candidate, stable, threshold), how it reads)
_LIMITS: dict[str, tuple[bool, Any, str]] = {
    "max": (False, lambda c, s, t: c <= t, "{c:.6g} <= {t:g}"),
    "max_increase": (True, lambda c, s, t: c - s <= t, "{c:.6g} - {s:.6g} <= {t:g}"),
    "max_ratio": (True, lambda c, s, t: c <= s * t, "{c:.6g} <= {s:.6g} x {t:g}"),
    "min": (False, lambda c, s, t: c >= t, "{c:.6g} >= {t:g}"),
    "max_drop": (True, lambda c, s, t: s - c <= t, "{s:.6g} - {c:.6g} <= {t:g}"),
    "min_ratio": (True, lambda c, s, t: c >= s * t, "{c:.6g} >= {s:.6g} x {t:g}"),
}


def _apply(metric: str, limits: BaseModel, cand: float | None, stable: float | None) -> list[ThresholdCheck]:
    checks = []
    for name, threshold in limits.model_dump(exclude_none=True).items():
        relative, passes, reads = _LIMITS[name]
        status: CheckStatus
        if cand is None:
            status, detail = "no_data", "no candidate data in the window"
        elif relative and stable is None:
            status, detail = "no_data", "no stable data in the window to compare with"
        else:
            status = "pass" if passes(cand, stable, threshold) else "fail"
            detail = reads.format(c=cand, s=stable, t=threshold)
        checks.append(
            ThresholdCheck(
                metric=metric,
                limit=name,
                threshold=threshold,
                candidate=cand,
                stable=stable,
                status=status,
                detail=detail,
            )
        )
    return checks


def evaluate_analysis(
    thresholds: AnalysisThresholds, candidate: WindowMetrics, stable: WindowMetrics
) -> list[ThresholdCheck]:
    """Every configured limit applied to the candidate's window, relative ones against stable's same window.

    A metric without data in the window (no requests, no drafted tokens) is ``no_data``: it neither fails
    nor passes, and relative limits are ``no_data`` while stable served nothing (weight 100).
    """
    checks: list[ThresholdCheck] = []
    for metric in ROLLOUT_METRICS:
        limits = getattr(thresholds, metric)
        if limits is not None:
            checks += _apply(metric, limits, getattr(candidate, metric), getattr(stable, metric))
    return checks


# ---------------------------------------------------------------------------------------------- windows
_CounterFields: Any = create_model(  # type: ignore[call-overload]
    "_CounterFields",
    **{
        name: (float, 0.0) if series.kind == "counter" else (Histogram, Field(default_factory=Histogram))
        for name, series in SERIES.items()
    },
)


class ReleaseCounters(_CounterFields):
    """Cumulative values of one release's series at one instant; windows are differences of two of these."""


class MetricsSnapshot(BaseModel):
    taken_at: float
    releases: dict[ReleaseName, ReleaseCounters]


def _delta(start: float, end: float) -> float:
    # A counter that went down was reset (the gateway restarted): everything since counts, as in PromQL.
    return end - start if end >= start else end


def _histogram_delta(start: Histogram, end: Histogram) -> Histogram:
    if end.count < start.count:
        return end
    return Histogram(
        buckets={le: _delta(start.buckets.get(le, 0.0), value) for le, value in end.buckets.items()},
        sum=end.sum - start.sum,
        count=end.count - start.count,
    )


class _CounterWindow:
    """A window of counter deltas only (histograms are empty)."""

    def __init__(self, counters: dict[str, float]) -> None:
        self.counters = counters

    def counter(self, name: str) -> float:
        return self.counters[name]

    def histogram(self, name: str) -> Histogram:
        return Histogram()


class _DeltaWindow:
    """The window between two snapshots of one release."""

    def __init__(self, start: ReleaseCounters, end: ReleaseCounters) -> None:
        self.start, self.end = start, end

    def counter(self, name: str) -> float:
        return _delta(getattr(self.start, name), getattr(self.end, name))

    def histogram(self, name: str) -> Histogram:
        return _histogram_delta(getattr(self.start, name), getattr(self.end, name))


def window_metrics(start: ReleaseCounters, end: ReleaseCounters) -> WindowMetrics:
    """One release's window (two ReleaseCounters): counter deltas and every rollout metric's value."""
    window = _DeltaWindow(start, end)
    counters = {name: window.counter(name) for name, series in SERIES.items() if series.kind == "counter"}
    values = {name: metric.window(window) for name, metric in ROLLOUT_METRICS.items()}
    return WindowMetrics(**counters, **values)
