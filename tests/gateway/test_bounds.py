"""Request bounds: 413 for oversized bodies (declared or streamed), 400 naming the field otherwise."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

from gateway.bounds import BodySizeLimit
from gateway.errors import GatewayError, install_error_handlers
from gateway.guardrails import check_request_bounds
from gateway.policy import RequestBounds

BOUNDS = RequestBounds(max_body_bytes=2048, max_tokens=100, max_n=2, max_messages=3, max_prompt_chars=50)


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=BOUNDS.max_body_bytes)

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    return TestClient(app)


def test_small_body_passes_through_intact(client: TestClient) -> None:
    assert client.post("/echo", content=b"x" * 2000).json() == {"bytes": 2000}


def test_declared_oversize_is_413(client: TestClient) -> None:
    response = client.post("/echo", content=b"x" * 5000)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_streamed_oversize_without_length_is_413(client: TestClient) -> None:
    def chunks():  # no content-length: chunked transfer
        for _ in range(10):
            yield b"y" * 500

    response = client.post("/echo", content=chunks())
    assert response.status_code == 413


def _chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "fast", "messages": [{"role": "user", "content": "hi"}]} | fields
    )


@pytest.mark.parametrize(
    ("request_fields", "param"),
    [
        ({"max_tokens": 101}, "max_tokens"),
        ({"max_completion_tokens": 500}, "max_completion_tokens"),
        ({"n": 3}, "n"),
        ({"messages": [{"role": "user", "content": "a"}] * 4}, "messages"),
        ({"messages": [{"role": "user", "content": "z" * 51}]}, "messages"),
    ],
)
def test_chat_bounds_name_the_field(request_fields: dict, param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        check_bounds(_chat(**request_fields), BOUNDS)
    assert caught.value.status == 400 and caught.value.param == param


def check_bounds(body: ChatCompletionRequest | CompletionRequest, bounds: RequestBounds) -> None:
    check_request_bounds(body.model_dump(exclude_unset=True), bounds)


def test_within_bounds_passes() -> None:
    check_bounds(_chat(max_tokens=100, n=2), BOUNDS)
    check_bounds(CompletionRequest.model_validate({"model": "fast", "prompt": "short"}), BOUNDS)
    with pytest.raises(GatewayError, match="prompt"):
        check_bounds(CompletionRequest.model_validate({"model": "fast", "prompt": "q" * 60}), BOUNDS)
