"""API keys, rate limits and tier routing through the live gateway, with the official `openai` client."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import openai
import pytest

from gateway.keys import SQLKeyStore, open_key_store
from tests.conftest import Gateway

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def store(gateway: Gateway) -> Iterator[SQLKeyStore]:
    keys = open_key_store(gateway.key_store)
    yield keys
    keys.close()


def _client(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.openai_url, api_key=key, timeout=300, max_retries=0)


def _ask(client: openai.OpenAI, model: str = "standard") -> object:
    return client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, temperature=0)


def test_missing_key_is_401(gateway: Gateway) -> None:
    response = httpx.post(
        f"{gateway.openai_url}/chat/completions", json={"model": "fast", "messages": QUESTION}, timeout=60
    )
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


def test_wrong_revoked_and_expired_keys_are_401(gateway: Gateway, store: SQLKeyStore) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        _ask(_client(gateway, "tk-not-a-real-key-000000000000"))
    assert caught.value.code == "invalid_api_key"

    revoked = store.create("revoked", "tests")
    store.revoke("revoked")
    with pytest.raises(openai.AuthenticationError) as caught:
        _ask(_client(gateway, revoked.key))
    assert caught.value.code == "api_key_revoked"

    expired = store.create("expired", "tests", expires_at=datetime.now(UTC) - timedelta(minutes=1))
    with pytest.raises(openai.AuthenticationError) as caught:
        _ask(_client(gateway, expired.key))
    assert caught.value.code == "api_key_expired"


def test_tier_not_allowed_is_403(gateway: Gateway, store: SQLKeyStore) -> None:
    fast_only = _client(gateway, store.create("fast-only", "tests", tiers=["fast"]).key)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        _ask(fast_only, "standard")
    assert caught.value.code == "tier_not_allowed"
    assert _ask(fast_only, "fast") is not None


def test_requests_per_minute_limit_is_429_with_retry_after(gateway: Gateway, store: SQLKeyStore) -> None:
    key = store.create("two-per-minute", "tests", requests_per_minute=2).key
    client = _client(gateway, key)
    _ask(client)
    _ask(client)
    response = httpx.post(
        f"{gateway.openai_url}/chat/completions",
        json={"model": "standard", "messages": QUESTION, "max_tokens": 4},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["type"] == "rate_limit_error"
    with pytest.raises(openai.RateLimitError):
        _ask(client)


def test_tokens_per_minute_limit(gateway: Gateway, store: SQLKeyStore) -> None:
    client = _client(gateway, store.create("few-tokens", "tests", tokens_per_minute=60).key)
    with pytest.raises(openai.RateLimitError):
        for _ in range(5):
            _ask(client)


def test_auto_routes_by_request_and_says_why(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.openai_url, api_key=gateway.api_key, timeout=300, max_retries=0)
    interactive = client.chat.completions.with_raw_response.create(
        model="auto", messages=QUESTION, max_tokens=8, temperature=0, stream=True
    )
    assert interactive.headers["x-tandem-tier"] == "fast"
    assert interactive.headers["x-tandem-route-reason"] == "auto_short_interactive"
    list(interactive.parse())
    batch = client.chat.completions.with_raw_response.create(
        model="tandem-auto", messages=QUESTION, max_tokens=8
    )
    assert batch.headers["x-tandem-tier"] == "standard"
    assert batch.headers["x-tandem-route-reason"] == "auto_not_streaming"


def test_stream_without_usage_request_gets_no_usage_chunk(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.openai_url, api_key=gateway.api_key, timeout=300, max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="fast", messages=QUESTION, max_tokens=8, temperature=0, stream=True
        )
    )
    assert chunks and all(chunk.usage is None for chunk in chunks)
