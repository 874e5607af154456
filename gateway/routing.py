"""Tier choice: explicit ``standard`` / ``fast``, the ``auto`` policy, and spilling fast -> standard.

The fast tier serves the same weights with speculative decoding, so its answers equal the standard
tier's; moving a request between them changes latency, never content. Speculation loses its edge under
heavy batching, so fast-tier traffic spills to the standard tier when the fast tier's in-flight count or
its moving-average latencies pass the policy's thresholds. Statistics are per ingress replica.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.policy import RoutingPolicy

STANDARD = "standard"
FAST = "fast"
AUTO = "auto"

RoutingReason = Literal[
    "requested",
    "auto_short_interactive",
    "auto_long_output",
    "auto_not_streaming",
    "spill_in_flight",
    "spill_ttft",
    "spill_tpot",
    "fast_unavailable",
    "fast_not_allowed",
    "standard_not_allowed",
]


@dataclass(frozen=True)
class RequestFeatures:
    """What routing looks at in a request."""

    requested_tier: str
    max_tokens: int | None = None
    stream: bool = False
    allowed_tiers: frozenset[str] | None = None

    def allows(self, tier: str) -> bool:
        return self.allowed_tiers is None or tier in self.allowed_tiers


def request_features(
    payload: Mapping[str, Any], requested_tier: str, allowed_tiers: Sequence[str] | None = None
) -> RequestFeatures:
    """Routing features of a chat or completion request given as a dict."""
    max_tokens = payload.get("max_completion_tokens") or payload.get("max_tokens")
    return RequestFeatures(
        requested_tier=requested_tier,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        stream=bool(payload.get("stream")),
        allowed_tiers=frozenset(allowed_tiers) if allowed_tiers is not None else None,
    )


@dataclass(frozen=True)
class TierSnapshot:
    """One tier's load as seen by this replica; a latency is None when unknown or stale."""

    in_flight: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True)
class RoutingDecision:
    tier: str
    reason: RoutingReason


class TierRouter:
    """Chooses the tier for a request from its features and the tiers' current load."""

    def __init__(
        self, policy: RoutingPolicy | None = None, *, tiers: frozenset[str] = frozenset({STANDARD, FAST})
    ):
        if STANDARD not in tiers:
            raise ValueError("the standard tier is required")
        self.policy = policy or RoutingPolicy()
        self.tiers = tiers

    def choose(self, features: RequestFeatures, stats: Mapping[str, TierSnapshot]) -> RoutingDecision:
        """The tier to call. ``requested_tier`` is 'standard', 'fast' or 'auto' (aliases resolved before)."""
        requested = features.requested_tier
        if requested not in (STANDARD, FAST, AUTO) and requested not in self.tiers:
            allowed = ", ".join(sorted(self.tiers | {AUTO}))
            raise ValueError(f"unknown tier {requested!r} (allowed: {allowed})")
        if requested not in (FAST, AUTO):
            # standard, and tiers only asked for by name (long): no spill, no substitute.
            return RoutingDecision(requested, "requested")
        if requested == AUTO:
            preferred = self._auto(features)
            if preferred.tier == STANDARD:
                if features.allows(STANDARD) or FAST not in self.tiers:
                    return preferred
                # A fast-only key still gets an answer: the fast tier gives the same text.
                preferred = RoutingDecision(FAST, "standard_not_allowed")
            elif not features.allows(FAST):
                return RoutingDecision(STANDARD, "fast_not_allowed")
        else:
            preferred = RoutingDecision(FAST, "requested")
        if FAST not in self.tiers:
            return RoutingDecision(STANDARD, "fast_unavailable")
        spill = self._spill_reason(stats.get(FAST, TierSnapshot()))
        if spill is not None and features.allows(STANDARD):
            return RoutingDecision(STANDARD, spill)
        return preferred

    def _auto(self, features: RequestFeatures) -> RoutingDecision:
        if self.policy.auto_fast_requires_stream and not features.stream:
            return RoutingDecision(STANDARD, "auto_not_streaming")
        if features.max_tokens is None or features.max_tokens > self.policy.auto_fast_max_tokens:
            return RoutingDecision(STANDARD, "auto_long_output")
        return RoutingDecision(FAST, "auto_short_interactive")

    def _spill_reason(self, fast: TierSnapshot) -> RoutingReason | None:
        if fast.in_flight >= self.policy.spill_max_in_flight:
            return "spill_in_flight"
        if (
            self.policy.spill_ttft_s is not None
            and fast.ttft_s is not None
            and fast.ttft_s > self.policy.spill_ttft_s
        ):
            return "spill_ttft"
        if (
            self.policy.spill_tpot_s is not None
            and fast.tpot_s is not None
            and fast.tpot_s > self.policy.spill_tpot_s
        ):
            return "spill_tpot"
        return None


@dataclass
class _TierState:
    in_flight: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    ttft_at: float = 0.0
    tpot_at: float = 0.0


@dataclass
class InFlightRequest:
    """One request's timing; created by ``TierStats.begin`` and closed by ``finish`` (idempotent)."""

    tier: str
    stats: TierStats
    started: float
    first_token_at: float | None = None
    output_tokens: int = 0
    finished: bool = field(default=False)

    def first_token(self) -> None:
        """Mark the first output token (the first streamed content, or the whole non-streamed answer)."""
        if self.first_token_at is None:
            self.first_token_at = self.stats.clock()

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    def tpot_s(self, now: float | None = None) -> float | None:
        """Seconds per output token after the first; None with fewer than two tokens."""
        if self.first_token_at is None or self.output_tokens < 2:
            return None
        end = self.stats.clock() if now is None else now
        return (end - self.first_token_at) / (self.output_tokens - 1)

    def finish(self, output_tokens: int | None = None, *, ok: bool = True) -> None:
        """Close the request; only successful requests feed the latency averages."""
        if self.finished:
            return
        self.finished = True
        if output_tokens is not None:
            self.output_tokens = output_tokens
        self.stats._finish(self, ok)


class TierStats:
    """Per-tier in-flight counts and exponentially weighted moving averages of TTFT and TPOT.

    An average older than ``stale_after_s`` is reported as unknown, so a tier that was spilled away
    from (and so gets no new samples) is tried again instead of being avoided forever.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.2,
        stale_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.alpha = alpha
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._lock = threading.Lock()
        self._tiers: dict[str, _TierState] = {}

    @classmethod
    def from_policy(cls, policy: RoutingPolicy, *, clock: Callable[[], float] = time.monotonic) -> TierStats:
        return cls(alpha=policy.ewma_alpha, stale_after_s=policy.stale_after_s, clock=clock)

    def begin(self, tier: str) -> InFlightRequest:
        with self._lock:
            self._tiers.setdefault(tier, _TierState()).in_flight += 1
        return InFlightRequest(tier=tier, stats=self, started=self.clock())

    def _finish(self, request: InFlightRequest, ok: bool) -> None:
        now = self.clock()
        ttft, tpot = request.ttft_s, request.tpot_s(now)
        with self._lock:
            state = self._tiers.setdefault(request.tier, _TierState())
            state.in_flight = max(0, state.in_flight - 1)
            if not ok:
                return
            if ttft is not None:
                state.ttft_s = self._blend(state.ttft_s, ttft, state.ttft_at, now)
                state.ttft_at = now
            if tpot is not None:
                state.tpot_s = self._blend(state.tpot_s, tpot, state.tpot_at, now)
                state.tpot_at = now

    def _blend(self, average: float | None, sample: float, at: float, now: float) -> float:
        if average is None or now - at > self.stale_after_s:
            return sample
        return self.alpha * sample + (1 - self.alpha) * average

    def snapshot(self) -> dict[str, TierSnapshot]:
        now = self.clock()
        with self._lock:
            return {
                tier: TierSnapshot(
                    in_flight=state.in_flight,
                    ttft_s=state.ttft_s if now - state.ttft_at <= self.stale_after_s else None,
                    tpot_s=state.tpot_s if now - state.tpot_at <= self.stale_after_s else None,
                )
                for tier, state in self._tiers.items()
            }
