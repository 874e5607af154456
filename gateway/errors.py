"""OpenAI-style errors: one body shape, one mapping from exceptions to HTTP status codes.

Every error the gateway returns looks like OpenAI's:
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``. Client mistakes are 4xx and name
the offending field; only genuine server faults are 5xx.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from infra.errors import TandemError

log = logging.getLogger(__name__)

_PARAMETER_IN_MESSAGE = re.compile(r"parameter=([A-Za-z_][\w.]*)")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class GatewayError(TandemError):
    """An error with an HTTP status, raised by the gateway for a specific request."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


class ModelNotFound(GatewayError):
    def __init__(self, model: str | None, available: list[str]) -> None:
        super().__init__(
            404,
            f"The model {model!r} does not exist. Available models: {', '.join(available)}.",
            param="model",
            code="model_not_found",
        )


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(status, message, param=param, code=code), status_code=status, headers=headers
    )


def _field_of(location: Any) -> str | None:
    parts = [str(part) for part in location if part not in ("body", "query", "path")]
    return ".".join(parts) or None


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "invalid"}
    field = _field_of(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return error_response(400, "The request body is not valid JSON.", code="invalid_json")
    if field is None and first.get("type") == "missing":
        return error_response(400, "The request body is missing or empty.", code="missing_body")
    details = "; ".join(f"{_field_of(e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in errors[:5])
    return error_response(400, f"Invalid request: {details}", param=field, code="invalid_parameter")


async def _on_http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    code = "model_not_found" if status == 404 and "model" in str(exc.detail).lower() else None
    return error_response(status, str(exc.detail), param="model" if code else None, code=code)


async def _on_gateway_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return error_response(
        exc.status, exc.message, param=exc.param, code=exc.code, headers=getattr(exc, "headers", None)
    )


async def _on_openai_http_error(_: Request, exc: Exception) -> JSONResponse:
    # Ray Serve LLM raises its own OpenAIHTTPException (status_code, message, type) from the engines,
    # e.g. for a prompt longer than the context window.
    status = int(getattr(exc, "status_code", 500))
    message = str(getattr(exc, "message", exc))
    # vLLM names the offending field inside its message: "... (parameter=max_tokens, value=-5)".
    named = _PARAMETER_IN_MESSAGE.search(message)
    code = "invalid_parameter" if status == 400 else str(getattr(exc, "type", "")) or None
    return error_response(status, message, param=named.group(1) if named else None, code=code)


@functools.cache
def engine_dead_types() -> tuple[type[BaseException], ...]:
    """vLLM's "the engine died" exception (a server-side outage); imported once, when the app is built."""
    from vllm.v1.engine.exceptions import EngineDeadError

    return (EngineDeadError,)


@functools.cache
def tier_failure_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean a tier died or is restarting, not that the request was wrong."""
    from ray.exceptions import RayActorError  # ActorDiedError and ActorUnavailableError derive from it

    return (*engine_dead_types(), RayActorError)


def raised_from(exc: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` or an exception it wraps is one of ``types``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, types):
            return True
        seen.add(id(current))
        # Ray re-raises a replica's exception as RayTaskError with the original as `cause`.
        current = getattr(current, "cause", None) or current.__cause__ or current.__context__
    return False


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException
    from vllm.exceptions import VLLMClientError

    if isinstance(exc, OpenAIHTTPException):
        return await _on_openai_http_error(_, exc)
    if isinstance(exc, VLLMClientError):
        # vLLM's request validators raise these outside pydantic; vLLM itself classes them as 4xx.
        message = str(getattr(exc, "args", [exc])[0] if getattr(exc, "args", None) else exc)
        return error_response(400, message, param=getattr(exc, "parameter", None), code="invalid_parameter")
    if raised_from(exc, engine_dead_types()):
        # The tier's engine died (Ray restarts the replica): a server-side outage, retryable.
        log.error("event=engine_dead error=%r", repr(exc)[:300])
        return error_response(503, "The model tier is restarting; retry shortly.", code="tier_unavailable",
                              headers={"Retry-After": "5"})  # fmt: skip
    log.exception("event=unhandled_error error=%r", exc)
    return error_response(500, "Internal server error.", code="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    """Register the OpenAI-format handlers on a FastAPI app."""
    from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException

    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(GatewayError, _on_gateway_error)
    app.add_exception_handler(OpenAIHTTPException, _on_openai_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
    engine_dead_types()  # import vLLM's exceptions now, not inside the first failing request
