"""The ingress emits every registered series that has an emission, under the names the rollout reads."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.canary import ReleaseMetrics


class _Instrument:
    def __init__(
        self, name: str, description: str = "", *, tag_keys: tuple[str, ...] = (), **kwargs: Any
    ) -> None:
        self.name, self.tag_keys, self.kwargs = name, tag_keys, kwargs
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def inc(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("inc", value, tags))

    def observe(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("observe", value, tags))


def test_release_metrics_emit_the_registered_series(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.util.metrics

    monkeypatch.setattr(ray.util.metrics, "Counter", _Instrument)
    monkeypatch.setattr(ray.util.metrics, "Histogram", _Instrument)
    metrics = ReleaseMetrics()
    names = {name: instrument.name for name, instrument in metrics.instruments.items()}
    assert names == {
        "requests": "tandem_requests_total",
        "errors": "tandem_request_errors_total",
        "ttft": "tandem_time_to_first_token_seconds",
        "tpot": "tandem_time_per_output_token_seconds",
    }
    assert metrics.instruments["ttft"].kwargs["boundaries"] == [0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16]
    metrics.record("candidate", "fast", server_error=True, ttft_s=None, tpot_s=0.02)
    metrics.record("stable", "standard", server_error=False, ttft_s=0.3, tpot_s=None)
    tags = {"release": "candidate", "tier": "fast"}
    stable = {"release": "stable", "tier": "standard"}
    assert metrics.instruments["requests"].calls == [("inc", 1, tags), ("inc", 1, stable)]
    assert metrics.instruments["errors"].calls == [("inc", 1, tags)]
    assert metrics.instruments["ttft"].calls == [("observe", 0.3, stable)]
    assert metrics.instruments["tpot"].calls == [("observe", 0.02, tags)]
