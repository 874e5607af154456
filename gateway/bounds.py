"""Request bounds, checked before any work is queued: body size (413), then max_tokens, n, message count
and prompt length (400 naming the field)."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, error_body
from gateway.policy import RequestBounds


class BodySizeLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` with 413, counting streamed chunks too."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        # Read the whole body first (it is at most max_bytes), then replay it to the app.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(
            scope,
            _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}], receive),
            send,
        )

    def _message(self) -> str:
        return f"The request body exceeds the limit of {self.max_bytes} bytes."

    async def _refuse(self, send: Send) -> None:
        payload = json.dumps(error_body(413, self._message(), code="request_too_large")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A receive callable that yields ``messages`` and then defers to ``then`` (disconnect notices)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


def _text_length(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(_text_length(part.get("text") if isinstance(part, dict) else part) for part in content)
    return len(str(content))


def check_bounds(body: Any, bounds: RequestBounds) -> None:
    """Raise a 400 naming the field when a parsed chat/completion request exceeds ``bounds``."""
    for field in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, field, None)
        if value is not None and value > bounds.max_tokens:
            raise GatewayError(
                400,
                f"{field} must be at most {bounds.max_tokens}, got {value}.",
                param=field,
                code="invalid_parameter",
            )
    n = getattr(body, "n", None)
    if n is not None and n > bounds.max_n:
        raise GatewayError(
            400, f"n must be at most {bounds.max_n}, got {n}.", param="n", code="invalid_parameter"
        )
    messages = getattr(body, "messages", None)
    if messages is not None:
        if len(messages) > bounds.max_messages:
            raise GatewayError(
                400,
                f"at most {bounds.max_messages} messages are accepted, got {len(messages)}.",
                param="messages",
                code="invalid_parameter",
            )
        chars = sum(
            _text_length(m.get("content") if isinstance(m, dict) else getattr(m, "content", None))
            for m in messages
        )
        field = "messages"
    else:
        prompt = getattr(body, "prompt", None)
        chars = (
            _text_length(prompt)
            if not isinstance(prompt, list) or all(isinstance(p, str) for p in prompt)
            else 0
        )
        field = "prompt"
    if chars > bounds.max_prompt_chars:
        raise GatewayError(
            400,
            f"the prompt is {chars} characters; the limit is {bounds.max_prompt_chars}.",
            param=field,
            code="invalid_parameter",
        )
