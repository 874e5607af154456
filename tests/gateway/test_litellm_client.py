"""The gateway through `litellm` as a client (its OpenAI-compatible provider)."""

from __future__ import annotations

import litellm
import pytest

from tests.conftest import Gateway

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _kwargs(gateway: Gateway) -> dict:
    return {"api_base": gateway.openai_url, "api_key": gateway.api_key, "timeout": 300, "num_retries": 0}


def test_chat(gateway: Gateway) -> None:
    response = litellm.completion(
        model="openai/fast", messages=QUESTION, max_tokens=16, temperature=0, **_kwargs(gateway)
    )
    assert "Paris" in response.choices[0].message.content
    assert response.usage.completion_tokens > 0


def test_streaming_with_usage(gateway: Gateway) -> None:
    stream = litellm.completion(
        model="openai/tandem-standard",
        messages=QUESTION,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **_kwargs(gateway),
    )
    chunks = list(stream)
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert any(getattr(c, "usage", None) and c.usage.completion_tokens > 0 for c in chunks)


def test_stop_and_n(gateway: Gateway) -> None:
    response = litellm.completion(
        model="openai/standard",
        messages=QUESTION,
        max_tokens=24,
        temperature=0.8,
        n=2,
        stop=["."],
        **_kwargs(gateway),
    )
    assert len(response.choices) == 2
    assert all("." not in (choice.message.content or "") for choice in response.choices)


def test_unknown_model_maps_to_not_found(gateway: Gateway) -> None:
    with pytest.raises(litellm.NotFoundError):
        litellm.completion(model="openai/nope", messages=QUESTION, **_kwargs(gateway))


def test_bad_parameter_maps_to_bad_request(gateway: Gateway) -> None:
    with pytest.raises(litellm.BadRequestError):
        litellm.completion(model="openai/fast", messages=QUESTION, max_tokens=100_000, **_kwargs(gateway))
