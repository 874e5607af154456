"""External upstreams through litellm: what answers a tier while its local engine is down.

An upstream is any litellm model (``hosted_vllm/...``, ``openai/...`` against an OpenAI-compatible
server, or another provider) configured per tier in ``gateway.upstreams``. Its answers come back in the
shape the local engines give (a JSON response, or an OpenAI SSE stream), so the pipeline's guardrails,
usage settlement and telemetry treat them exactly like a local answer. Upstream failures become
``UpstreamError`` (502/503/504, OpenAI error body), never a stack trace.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.errors import GatewayError
from gateway.policy import UpstreamPolicy

log = logging.getLogger(__name__)

CHAT = "chat"
RETRY_AFTER_S = 5


class UpstreamError(GatewayError):
    """The upstream failed: 502 (an error, or it refused the gateway's key), 503 with ``Retry-After``
    (unreachable or overloaded), 504 (slower than the configured timeout)."""

    def __init__(self, status: int, message: str, *, code: str) -> None:
        super().__init__(status, message, code=code)
        self.headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None


class CircuitBreaker:
    """Remembers which local engines failed recently: one stays 'open' (skipped) until its cooldown ends,
    then the next request tries it again and a new failure re-opens it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._open_until: dict[str, float] = {}

    def trip(self, engine: str, cooldown_s: float) -> None:
        self._open_until[engine] = self.clock() + cooldown_s

    def is_open(self, engine: str) -> bool:
        until = self._open_until.get(engine)
        if until is None:
            return False
        if self.clock() < until:
            return True
        del self._open_until[engine]
        return False


def _litellm() -> Any:
    # Offline by default: the gateway may have no internet access, and litellm would otherwise fetch
    # its model price list from GitHub on import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # no "Give Feedback" banners on stdout
    return litellm


class UpstreamClient:
    """Calls one configured upstream with a gateway request and answers in the local engines' format."""

    def __init__(self, policy: UpstreamPolicy) -> None:
        self.policy = policy
        self.version = f"upstream:{policy.model}"
        self._litellm = _litellm()
        provider = policy.model.split("/", 1)[0]
        supported = self._litellm.get_supported_openai_params(
            model=policy.model, custom_llm_provider=provider
        )
        self._named_fields = frozenset(supported or ()) | _INPUTS
        self._api_key = os.environ.get(policy.api_key_env) if policy.api_key_env else None
        if policy.api_key_env and not self._api_key:
            log.error("event=upstream_key_missing model=%s env=%s", policy.model, policy.api_key_env)

    async def answer(self, body: Any, operation: str) -> Response:
        """The upstream's answer to ``body`` (a chat or text completion request) as the engines give it:
        a ``JSONResponse``, or a ``StreamingResponse`` of OpenAI SSE events ending in ``[DONE]``."""
        if self.policy.api_key_env and not self._api_key:
            raise UpstreamError(
                502,
                f"The fallback upstream is misconfigured: ${self.policy.api_key_env} is not set.",
                code="upstream_misconfigured",
            )
        request = self._arguments(body)
        try:
            if operation == CHAT:
                result = await self._litellm.acompletion(**request)
            else:
                result = await self._litellm.atext_completion(**request)
        except Exception as exc:
            raise self._error(exc) from exc
        if request.get("stream"):
            return StreamingResponse(self._events(result, body.model), media_type="text/event-stream")
        return JSONResponse(_openai_json(result, body.model))

    def _arguments(self, body: Any) -> dict[str, Any]:
        payload = body.model_dump(exclude_unset=True, exclude={"model"})
        # What litellm does not know as an OpenAI parameter (vLLM's extensions) travels in the body as is.
        extra = {name: payload.pop(name) for name in list(payload) if name not in self._named_fields}
        request: dict[str, Any] = payload | {
            "model": self.policy.model,
            "api_base": self.policy.api_base,
            "api_key": self._api_key,
            "timeout": self.policy.timeout_s,
            "num_retries": 0,
        }
        if extra:
            request["extra_body"] = extra
        return request

    async def _events(self, stream: Any, model: str) -> AsyncIterator[str]:
        try:
            async for chunk in stream:
                yield f"data: {json.dumps(_openai_json(chunk, model), separators=(',', ':'))}\n\n"
        except Exception as exc:
            raise self._error(exc) from exc
        yield "data: [DONE]\n\n"

    def _error(self, exc: Exception) -> UpstreamError:
        """The gateway's error for an upstream failure; the full cause goes to the log, not the client."""
        log.warning("event=upstream_error model=%s error=%r", self.policy.model, repr(exc)[:300])
        litellm = self._litellm
        status = getattr(exc, "status_code", None)
        causes = list(_causes(exc))
        if any(
            isinstance(cause, litellm.Timeout | httpx.TimeoutException | TimeoutError) for cause in causes
        ):
            return UpstreamError(
                504,
                f"The fallback upstream did not answer within {self.policy.timeout_s:g}s.",
                code="upstream_timeout",
            )
        # litellm reports a refused connection as a 500 whose cause is the connect error.
        if any(isinstance(cause, httpx.ConnectError | ConnectionError) for cause in causes):
            return UpstreamError(503, "The fallback upstream is unreachable.", code="upstream_unreachable")
        if isinstance(exc, litellm.RateLimitError) or status in (429, 503):
            return UpstreamError(
                503, "The fallback upstream is overloaded; retry shortly.", code="upstream_busy"
            )
        if isinstance(exc, litellm.AuthenticationError | litellm.PermissionDeniedError):
            return UpstreamError(
                502, "The fallback upstream refused the gateway's credentials.", code="upstream_auth_failed"
            )
        return UpstreamError(
            502,
            f"The fallback upstream failed ({type(exc).__name__}, status {status}).",
            code="upstream_error",
        )


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from, innermost last."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


# Request fields that are inputs rather than parameters: litellm takes them by name.
_INPUTS = frozenset({"messages", "prompt", "stream", "stream_options"})
_LITELLM_FIELD = "provider_specific_fields"


def _openai_json(result: Any, model: str) -> dict[str, Any]:
    """An OpenAI-format dict of a litellm response or stream chunk, under the gateway's model id."""
    data: dict[str, Any] = result.model_dump(exclude_none=True)
    data["model"] = model
    # litellm's own additions, not part of OpenAI's format.
    data.pop(_LITELLM_FIELD, None)
    for choice in data.get("choices") or []:
        choice.pop(_LITELLM_FIELD, None)
        for part in ("message", "delta"):
            if isinstance(choice.get(part), dict):
                choice[part].pop(_LITELLM_FIELD, None)
    return data
