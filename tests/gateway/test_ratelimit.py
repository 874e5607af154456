"""Token buckets: refill, refusal with Retry-After, settlement, and correctness under concurrency."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.errors import error_body
from gateway.keys import KeyRecord, SQLKeyStore, open_key_store
from gateway.policy import LimitPolicy
from gateway.ratelimit import RateLimited, RateLimiter, estimate_tokens


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(store_url: str) -> Iterator[SQLKeyStore]:
    key_store = open_key_store(store_url)
    yield key_store
    key_store.close()


def _key(store: SQLKeyStore, name: str = "k", **limits: int | None) -> KeyRecord:
    return store.create(name, "alice", **limits).record  # type: ignore[arg-type]


def test_requests_per_minute_bucket_refuses_then_refills(store: SQLKeyStore) -> None:
    clock = FakeClock()
    limiter = RateLimiter(store.database, LimitPolicy(tokens_per_minute=None), clock=clock)
    key = _key(store, requests_per_minute=3)
    for expected_remaining in (2, 1, 0):
        reservation = limiter.check(key, 10)
        assert reservation.headers()["x-ratelimit-remaining-requests"] == str(expected_remaining)
    with pytest.raises(RateLimited) as caught:
        limiter.check(key, 10)
    refusal = caught.value
    # 3/minute refills one request every 20 s.
    assert refusal.status == 429 and refusal.retry_after_s == 20
    assert refusal.headers["Retry-After"] == "20" and refusal.code == "rate_limit_requests"
    assert (
        error_body(refusal.status, refusal.message, code=refusal.code)["error"]["type"] == "rate_limit_error"
    )
    clock.now += 19
    with pytest.raises(RateLimited):
        limiter.check(key, 10)
    clock.now += 1
    limiter.check(key, 10)
    with pytest.raises(RateLimited):
        limiter.check(key, 10)
    # A long idle period refills only up to the limit.
    clock.now += 3600
    for _ in range(3):
        limiter.check(key, 10)
    with pytest.raises(RateLimited):
        limiter.check(key, 10)


def test_tokens_per_minute_bucket_and_settlement(store: SQLKeyStore) -> None:
    clock = FakeClock()
    limiter = RateLimiter(store.database, LimitPolicy(requests_per_minute=None), clock=clock)
    key = _key(store, tokens_per_minute=600)
    first = limiter.check(key, 500)
    assert first.remaining["tokens"] == 100
    with pytest.raises(RateLimited) as caught:
        limiter.check(key, 200)
    # 100 tokens short at 10 tokens/s.
    assert caught.value.retry_after_s == 10 and caught.value.code == "rate_limit_tokens"
    # The request used only 150 of its 500 reserved tokens: 350 come back.
    limiter.record_usage(first, 150)
    limiter.record_usage(first, 0)  # settling twice changes nothing
    second = limiter.check(key, 400)
    assert second.remaining["tokens"] == pytest.approx(50)
    # Using more than reserved drives the bucket negative and delays the next request.
    limiter.record_usage(second, 600)
    assert second.remaining["tokens"] == pytest.approx(-150)
    with pytest.raises(RateLimited) as caught:
        limiter.check(key, 1)
    assert caught.value.retry_after_s == 16


def test_estimate_above_the_whole_budget_waits_for_a_full_bucket(store: SQLKeyStore) -> None:
    clock = FakeClock()
    limiter = RateLimiter(store.database, LimitPolicy(requests_per_minute=None), clock=clock)
    key = _key(store, tokens_per_minute=100)
    reservation = limiter.check(key, 10_000)
    assert reservation.reserved_tokens == 100
    with pytest.raises(RateLimited):
        limiter.check(key, 10_000)
    clock.now += 60
    limiter.check(key, 10_000)


def test_key_limits_override_policy_defaults(store: SQLKeyStore) -> None:
    limiter = RateLimiter(
        store.database, LimitPolicy(requests_per_minute=2, tokens_per_minute=None), clock=FakeClock()
    )
    defaulted, generous = _key(store, "defaulted"), _key(store, "generous", requests_per_minute=5)
    assert limiter.limits_for(defaulted).requests_per_minute == 2
    assert limiter.limits_for(generous).requests_per_minute == 5
    allowed = 0
    for _ in range(10):
        try:
            limiter.check(defaulted, 1)
            allowed += 1
        except RateLimited:
            pass
    assert allowed == 2
    for _ in range(5):
        limiter.check(generous, 1)
    # Keys have separate buckets; no limit at all means no refusal and no headers.
    unlimited = RateLimiter(store.database, LimitPolicy(requests_per_minute=None, tokens_per_minute=None))
    for _ in range(50):
        assert unlimited.check(defaulted, 10**6).headers() == {}


def test_a_refused_request_consumes_nothing(store: SQLKeyStore) -> None:
    clock = FakeClock()
    limiter = RateLimiter(store.database, LimitPolicy(), clock=clock)
    key = _key(store, requests_per_minute=10, tokens_per_minute=100)
    limiter.check(key, 90)
    for _ in range(5):
        with pytest.raises(RateLimited) as caught:
            limiter.check(key, 50)
        assert caught.value.headers["x-ratelimit-remaining-requests"] == "9"
    assert limiter.check(key, 10).remaining["requests"] == 8


def test_estimate_tokens() -> None:
    assert estimate_tokens(400, 50, default_max_tokens=4096) == 150
    assert estimate_tokens(401, None, default_max_tokens=100) == 201
    assert estimate_tokens(0, 10, n=3, default_max_tokens=100) == 30


# -- concurrency ------------------------------------------------------------------------------------
BUCKET = 20
ATTEMPTS = 15


def _hammer(url: str, key: KeyRecord, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = open_key_store(url)
    limiter = RateLimiter(store.database, LimitPolicy(tokens_per_minute=None), clock=lambda: 5_000_000.0)
    allowed = 0
    for _ in range(ATTEMPTS):
        try:
            limiter.check(key, 1)
            allowed += 1
        except RateLimited:
            pass
    store.close()
    results.put(allowed)


def test_processes_sharing_one_sqlite_file_never_exceed_the_bucket(tmp_path: Path) -> None:
    url = str(tmp_path / "shared.db")
    store = open_key_store(url)
    key = _key(store, requests_per_minute=BUCKET)
    store.close()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=_hammer, args=(url, key, results)) for _ in range(4)]
    for worker in workers:
        worker.start()
    counts = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    # 60 attempts at a frozen clock against a bucket of 20: exactly 20 pass, whatever the interleaving.
    assert sum(counts) == BUCKET, counts


def test_threads_on_either_backend_never_exceed_the_bucket(store_url: str) -> None:
    store = open_key_store(store_url)
    key = _key(store, requests_per_minute=BUCKET)
    limiter = RateLimiter(store.database, LimitPolicy(tokens_per_minute=None), clock=lambda: 5_000_000.0)
    allowed: list[int] = []
    errors: list[BaseException] = []

    def hammer() -> None:
        count = 0
        try:
            for _ in range(ATTEMPTS):
                try:
                    limiter.check(key, 1)
                    count += 1
                except RateLimited:
                    pass
        except BaseException as exc:
            errors.append(exc)
        allowed.append(count)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    store.close()
    assert not errors, errors
    assert sum(allowed) == BUCKET, allowed
