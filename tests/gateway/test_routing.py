"""Tier routing: explicit tiers, the auto policy, spilling fast -> standard, and the stats tracker."""

from __future__ import annotations

import pytest

from gateway.policy import RoutingPolicy
from gateway.routing import (
    FAST,
    STANDARD,
    RequestFeatures,
    TierRouter,
    TierSnapshot,
    TierStats,
    request_features,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


POLICY = RoutingPolicy(
    auto_fast_max_tokens=256, spill_max_in_flight=4, spill_ttft_s=1.0, spill_tpot_s=0.1, stale_after_s=30
)
IDLE: dict[str, TierSnapshot] = {}


def choose(
    features: RequestFeatures, stats: dict[str, TierSnapshot] = IDLE, **kwargs: object
) -> tuple[str, str]:
    decision = TierRouter(POLICY, **kwargs).choose(features, stats)  # type: ignore[arg-type]
    return decision.tier, decision.reason


def test_explicit_tiers() -> None:
    assert choose(RequestFeatures("standard", max_tokens=10, stream=True)) == (STANDARD, "requested")
    assert choose(RequestFeatures("fast", max_tokens=4000)) == (FAST, "requested")
    # Standard never spills, whatever the load.
    busy = {STANDARD: TierSnapshot(in_flight=100, ttft_s=9.0)}
    assert choose(RequestFeatures("standard"), busy) == (STANDARD, "requested")
    with pytest.raises(ValueError, match="unknown tier"):
        choose(RequestFeatures("turbo"))


@pytest.mark.parametrize(
    ("max_tokens", "stream", "expected"),
    [
        (128, True, (FAST, "auto_short_interactive")),
        (256, True, (FAST, "auto_short_interactive")),
        (257, True, (STANDARD, "auto_long_output")),
        (None, True, (STANDARD, "auto_long_output")),
        (128, False, (STANDARD, "auto_not_streaming")),
    ],
)
def test_auto_policy(max_tokens: int | None, stream: bool, expected: tuple[str, str]) -> None:
    assert choose(RequestFeatures("auto", max_tokens=max_tokens, stream=stream)) == expected


def test_auto_without_the_stream_requirement() -> None:
    router = TierRouter(RoutingPolicy(auto_fast_requires_stream=False, auto_fast_max_tokens=64))
    decision = router.choose(RequestFeatures("auto", max_tokens=64, stream=False), {})
    assert (decision.tier, decision.reason) == (FAST, "auto_short_interactive")


@pytest.mark.parametrize(
    ("fast", "reason"),
    [
        (TierSnapshot(in_flight=4), "spill_in_flight"),
        (TierSnapshot(in_flight=1, ttft_s=1.5), "spill_ttft"),
        (TierSnapshot(in_flight=1, ttft_s=0.2, tpot_s=0.2), "spill_tpot"),
    ],
)
def test_fast_spills_to_standard_past_thresholds(fast: TierSnapshot, reason: str) -> None:
    stats = {FAST: fast}
    assert choose(RequestFeatures("fast"), stats) == (STANDARD, reason)
    assert choose(RequestFeatures("auto", max_tokens=16, stream=True), stats) == (STANDARD, reason)


def test_no_spill_below_thresholds_or_without_latency_data() -> None:
    calm = {FAST: TierSnapshot(in_flight=3, ttft_s=1.0, tpot_s=0.1)}
    assert choose(RequestFeatures("fast"), calm) == (FAST, "requested")
    assert choose(RequestFeatures("fast"), {FAST: TierSnapshot(in_flight=0)}) == (FAST, "requested")
    no_latency_limits = TierRouter(RoutingPolicy(spill_ttft_s=None, spill_tpot_s=None, spill_max_in_flight=4))
    slow = {FAST: TierSnapshot(in_flight=3, ttft_s=50.0, tpot_s=5.0)}
    assert no_latency_limits.choose(RequestFeatures("fast"), slow).tier == FAST


def test_key_tier_restrictions_shape_the_choice() -> None:
    fast_only = frozenset({FAST})
    standard_only = frozenset({STANDARD})
    # auto picks a tier the key may use.
    assert choose(RequestFeatures("auto", max_tokens=16, stream=True, allowed_tiers=standard_only)) == (
        STANDARD,
        "fast_not_allowed",
    )
    assert choose(RequestFeatures("auto", max_tokens=4000, allowed_tiers=fast_only)) == (
        FAST,
        "standard_not_allowed",
    )
    # A fast-only key is never spilled to a tier it may not use.
    overloaded = {FAST: TierSnapshot(in_flight=50)}
    assert choose(RequestFeatures("fast", allowed_tiers=fast_only), overloaded) == (FAST, "requested")


def test_no_fast_tier_deployed() -> None:
    only_standard = frozenset({STANDARD})
    assert choose(RequestFeatures("fast"), tiers=only_standard) == (STANDARD, "fast_unavailable")
    assert choose(RequestFeatures("auto", max_tokens=8, stream=True), tiers=only_standard) == (
        STANDARD,
        "fast_unavailable",
    )
    with pytest.raises(ValueError, match="standard"):
        TierRouter(POLICY, tiers=frozenset({FAST}))


def test_stats_track_in_flight_and_moving_averages() -> None:
    clock = FakeClock()
    stats = TierStats(alpha=0.5, stale_after_s=30, clock=clock)
    first, second = stats.begin(FAST), stats.begin(FAST)
    stats.begin(STANDARD)
    assert stats.snapshot()[FAST].in_flight == 2 and stats.snapshot()[STANDARD].in_flight == 1
    clock.now += 0.4
    first.first_token()
    first.first_token()  # only the first call counts
    clock.now += 1.0
    first.finish(11)  # 10 tokens after the first in 1.0 s
    first.finish(11)  # idempotent: in-flight does not go negative twice
    snapshot = stats.snapshot()[FAST]
    assert snapshot.in_flight == 1
    assert snapshot.ttft_s == pytest.approx(0.4) and snapshot.tpot_s == pytest.approx(0.1)
    clock.now += 0.2
    second.first_token()  # ttft 1.6 s
    clock.now += 0.3
    second.finish(4)  # 3 tokens in 0.3 s -> 0.1 s/token
    snapshot = stats.snapshot()[FAST]
    assert snapshot.in_flight == 0
    assert snapshot.ttft_s == pytest.approx(0.5 * 1.6 + 0.5 * 0.4)
    assert snapshot.tpot_s == pytest.approx(0.1)


def test_failed_requests_free_their_slot_but_do_not_feed_latency() -> None:
    clock = FakeClock()
    stats = TierStats(clock=clock)
    request = stats.begin(FAST)
    clock.now += 5
    request.first_token()
    request.finish(10, ok=False)
    snapshot = stats.snapshot()[FAST]
    assert snapshot.in_flight == 0 and snapshot.ttft_s is None and snapshot.tpot_s is None
    single = stats.begin(FAST)
    single.first_token()
    single.finish(1)  # one token: a TTFT sample but no TPOT
    assert stats.snapshot()[FAST].ttft_s == pytest.approx(0.0) and stats.snapshot()[FAST].tpot_s is None


def test_stale_latency_stops_the_spill_so_the_fast_tier_recovers() -> None:
    clock = FakeClock()
    stats = TierStats.from_policy(POLICY, clock=clock)
    router = TierRouter(POLICY)
    slow = stats.begin(FAST)
    clock.now += 3.0
    slow.first_token()
    slow.finish(1)
    assert router.choose(RequestFeatures("fast"), stats.snapshot()).reason == "spill_ttft"
    clock.now += 31
    assert stats.snapshot()[FAST].ttft_s is None
    assert router.choose(RequestFeatures("fast"), stats.snapshot()) == router.choose(
        RequestFeatures("fast"), {}
    )
    # A fresh fast sample after staleness replaces the old average instead of blending with it.
    quick = stats.begin(FAST)
    clock.now += 0.1
    quick.first_token()
    quick.finish(1)
    assert stats.snapshot()[FAST].ttft_s == pytest.approx(0.1)


def test_request_features_from_a_payload() -> None:
    features = request_features({"max_tokens": 64, "stream": True}, "auto", ["fast"])
    assert features == RequestFeatures("auto", max_tokens=64, stream=True, allowed_tiers=frozenset({FAST}))
    assert request_features({"max_completion_tokens": 8, "max_tokens": 64}, "fast").max_tokens == 8
    assert request_features({}, "standard") == RequestFeatures("standard")
