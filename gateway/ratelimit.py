"""Per-key token buckets for requests/minute and tokens/minute, shared by every ingress replica.

The buckets live in the key store's database, so replicas on different machines see one budget: each
``check`` refills and debits both buckets in one write transaction (SQLite ``BEGIN IMMEDIATE``,
PostgreSQL row locks via ``SELECT ... FOR UPDATE``). A request reserves its estimated tokens up front
(prompt + max_tokens); ``record_usage`` settles the reservation against the tokens actually used.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.database import Cursor, Database
from gateway.errors import GatewayError
from gateway.keys import KeyRecord
from gateway.policy import LimitPolicy

log = logging.getLogger(__name__)

REQUESTS = "requests"
TOKENS = "tokens"


def estimate_tokens(prompt_chars: int, max_tokens: int | None, *, n: int = 1, default_max_tokens: int) -> int:
    """A request's tokens before it runs: about 4 characters per prompt token plus the completion budget
    (``max_tokens`` or ``default_max_tokens``) for each of ``n`` choices. ``record_usage`` settles it."""
    completion = max_tokens if max_tokens is not None else default_max_tokens
    return math.ceil(prompt_chars / 4) + max(1, n) * max(0, completion)


class RateLimited(GatewayError):
    """429 with the seconds to wait in ``retry_after_s`` and a ``Retry-After`` header."""

    def __init__(self, message: str, *, retry_after_s: int, code: str, headers: dict[str, str]) -> None:
        super().__init__(429, message, code=code)
        self.retry_after_s = retry_after_s
        self.headers = {"Retry-After": str(retry_after_s)} | headers


@dataclass(frozen=True)
class Limits:
    """A key's effective per-minute limits; None is unlimited."""

    requests_per_minute: int | None
    tokens_per_minute: int | None

    def of(self, kind: str) -> int | None:
        return self.requests_per_minute if kind == REQUESTS else self.tokens_per_minute


@dataclass
class Reservation:
    """What ``check`` debited for one request; pass it to ``record_usage`` when the request ends."""

    key_id: str
    reserved_tokens: int
    limits: Limits
    remaining: dict[str, float] = field(default_factory=dict)
    settled: bool = False

    def headers(self) -> dict[str, str]:
        """OpenAI-style ``x-ratelimit-*`` headers for the response."""
        headers: dict[str, str] = {}
        for kind in (REQUESTS, TOKENS):
            limit = self.limits.of(kind)
            if limit is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(self.remaining[kind])))
        return headers


class RateLimiter:
    """Token buckets per key: capacity = the per-minute limit, refilled continuously at limit/60 per s."""

    def __init__(
        self,
        database: Database,
        defaults: LimitPolicy | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Wall-clock time, not monotonic: replicas on different hosts compare timestamps in the database.
        self.database = database
        self.defaults = defaults or LimitPolicy()
        self.clock = clock

    def limits_for(self, key: KeyRecord) -> Limits:
        return Limits(
            requests_per_minute=key.requests_per_minute or self.defaults.requests_per_minute,
            tokens_per_minute=key.tokens_per_minute or self.defaults.tokens_per_minute,
        )

    def check(self, key: KeyRecord, estimated_tokens: int) -> Reservation:
        """Debit one request and ``estimated_tokens`` from the key's buckets, or raise RateLimited (429).

        An estimate above the whole tokens/minute budget is clamped to it (the request then needs a full
        bucket); ``record_usage`` later charges what was really used.
        """
        limits = self.limits_for(key)
        now = self.clock()
        estimate = max(0, int(estimated_tokens))
        if limits.tokens_per_minute is not None:
            estimate = min(estimate, limits.tokens_per_minute)
        wanted = {REQUESTS: 1.0, TOKENS: float(estimate)}
        kinds = [kind for kind in (REQUESTS, TOKENS) if limits.of(kind) is not None]
        with self.database.transaction(write=True) as cursor:
            levels = {
                kind: self._refilled(cursor, key.key_id, kind, limits.of(kind) or 0, now) for kind in kinds
            }
            short = {kind: wanted[kind] - levels[kind] for kind in kinds if levels[kind] < wanted[kind]}
            if not short:
                for kind in kinds:
                    levels[kind] -= wanted[kind]
                    self._store(cursor, key.key_id, kind, levels[kind], now)
        if short:
            raise self._refusal(key, limits, short, levels)
        remaining = {kind: levels.get(kind, math.inf) for kind in (REQUESTS, TOKENS)}
        return Reservation(key_id=key.key_id, reserved_tokens=estimate, limits=limits, remaining=remaining)

    def record_usage(self, reservation: Reservation, actual_tokens: int) -> None:
        """Settle a reservation: refund unused estimated tokens or charge the excess (the bucket may go
        negative, delaying the key's next requests). Idempotent; a failed request settles with 0."""
        if reservation.settled:
            return
        reservation.settled = True
        limit = reservation.limits.tokens_per_minute
        delta = reservation.reserved_tokens - max(0, int(actual_tokens))
        if limit is None or delta == 0:
            return
        now = self.clock()
        with self.database.transaction(write=True) as cursor:
            level = self._refilled(cursor, reservation.key_id, TOKENS, limit, now)
            level = min(float(limit), level + delta)
            self._store(cursor, reservation.key_id, TOKENS, level, now)
        reservation.remaining[TOKENS] = level

    def _refilled(self, cursor: Cursor, key_id: str, kind: str, limit: int, now: float) -> float:
        """The bucket's level at ``now``, with its row locked for the rest of the transaction."""
        p = self.database.param
        if self.database.dialect == "postgresql":
            cursor.execute(
                f"INSERT INTO tandem_rate_buckets (key_id, kind, level, updated_at) VALUES ({p}, {p}, {p}, {p}) "
                "ON CONFLICT (key_id, kind) DO NOTHING",
                (key_id, kind, float(limit), now),
            )
            cursor.execute(
                f"SELECT level, updated_at FROM tandem_rate_buckets WHERE key_id = {p} AND kind = {p} FOR UPDATE",
                (key_id, kind),
            )
        else:
            cursor.execute(
                f"SELECT level, updated_at FROM tandem_rate_buckets WHERE key_id = {p} AND kind = {p}",
                (key_id, kind),
            )
        row = cursor.fetchone()
        if row is None:
            return float(limit)
        level, updated_at = float(row[0]), float(row[1])
        # A clock behind the stored timestamp (another host's skew) refills nothing rather than draining.
        elapsed = max(0.0, now - updated_at)
        return min(float(limit), level + elapsed * limit / 60.0)

    def _store(self, cursor: Cursor, key_id: str, kind: str, level: float, now: float) -> None:
        p = self.database.param
        cursor.execute(
            f"INSERT INTO tandem_rate_buckets (key_id, kind, level, updated_at) VALUES ({p}, {p}, {p}, {p}) "
            "ON CONFLICT (key_id, kind) DO UPDATE SET level = excluded.level, updated_at = excluded.updated_at",
            (key_id, kind, level, now),
        )

    def _refusal(
        self, key: KeyRecord, limits: Limits, short: dict[str, float], levels: dict[str, float]
    ) -> RateLimited:
        waits = {kind: missing * 60.0 / (limits.of(kind) or 1) for kind, missing in short.items()}
        kind = max(waits, key=lambda k: waits[k])
        retry_after = max(1, math.ceil(waits[kind]))
        limit = limits.of(kind)
        log.info("event=rate_limited key_id=%s kind=%s retry_after_s=%d", key.key_id, kind, retry_after)
        headers = {f"x-ratelimit-limit-{k}": str(limits.of(k)) for k in levels} | {
            f"x-ratelimit-remaining-{k}": str(max(0, math.floor(levels[k]))) for k in levels
        }
        return RateLimited(
            f"Rate limit reached for API key {key.key_id}... on {kind} per minute: limit {limit}, "
            f"please try again in {retry_after}s.",
            retry_after_s=retry_after,
            code=f"rate_limit_{kind}",
            headers=headers,
        )
