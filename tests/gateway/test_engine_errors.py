"""Engine failures are recognised by exception type (also when Ray wraps them), never by their text."""

from __future__ import annotations

import asyncio
import json

from gateway.errors import _on_unexpected, engine_dead_types, raised_from, tier_failure_types
from gateway.pipeline import _engine_failed


def test_engine_and_actor_failures_by_type_also_when_wrapped() -> None:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError
    from vllm.v1.engine.exceptions import EngineDeadError

    dead = EngineDeadError("EngineCore encountered an issue.")
    assert raised_from(dead, engine_dead_types()) and _engine_failed(dead)
    assert _engine_failed(ActorDiedError()) and _engine_failed(ActorUnavailableError("restarting", None))
    wrapped = RayTaskError("LLMServer.chat", "traceback", dead).as_instanceof_cause()
    assert _engine_failed(wrapped)
    try:
        try:
            raise dead
        except EngineDeadError as exc:
            raise RuntimeError("the stream ended") from exc
    except RuntimeError as chained:
        assert _engine_failed(chained)
    # A client mistake that merely mentions the name is not an engine failure.
    assert not _engine_failed(ValueError("EngineDeadError in the prompt"))
    assert not raised_from(ValueError("x"), tier_failure_types())


def test_a_dead_engine_is_a_retryable_503() -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    response = asyncio.run(_on_unexpected(None, EngineDeadError("gone")))  # type: ignore[arg-type]
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    assert json.loads(bytes(response.body))["error"]["code"] == "tier_unavailable"
    other = asyncio.run(_on_unexpected(None, ValueError("EngineDeadError")))  # type: ignore[arg-type]
    assert other.status_code == 500
