"""Canary split in the request pipeline: sticky per session, driven by the controller's weights file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from ray.serve.llm.openai_api_models import ChatCompletionRequest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.canary import ReleaseSplitter
from gateway.pipeline import RequestPipeline, TierTarget
from gateway.policy import GatewayPolicy

TARGETS = [
    TierTarget("standard", "tandem-standard", ("standard",), "m@v1"),
    TierTarget("fast", "tandem-fast", ("fast",), "m@v1+d@v1"),
    TierTarget("standard", "tandem-standard-candidate", (), "m@v2", "candidate"),
    TierTarget("fast", "tandem-fast-candidate", (), "m@v2+d@v2", "candidate"),
]


def _request(session: str) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions",
                    "headers": [(b"x-session-id", session.encode())], "client": ("127.0.0.1", 5000)})  # fmt: skip


async def _engine(body: Any, _: Request) -> Response:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    return JSONResponse({"model": body.model, "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}], "usage": usage})  # fmt: skip


def _weights(path: Path, candidate: int) -> None:
    path.write_text(json.dumps({"stable": 100 - candidate, "candidate": candidate, "salt": "s"}))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000 * candidate + 1))


async def _release(pipeline: RequestPipeline, session: str, model: str = "standard") -> tuple[str, str]:
    body = ChatCompletionRequest.model_validate(
        {"model": model, "messages": [{"role": "user", "content": "x"}]}
    )
    response = await pipeline.handle(body, _request(session), _engine, "chat")
    payload = json.loads(bytes(response.body))
    return response.headers["x-tandem-release"], payload["model"]


async def test_split_follows_the_weights_file_and_is_sticky(tmp_path: Path) -> None:
    weights = tmp_path / "weights.json"
    pipeline = RequestPipeline(GatewayPolicy(), TARGETS, weights_file=str(weights))
    sessions = [f"session-{i}" for i in range(200)]
    assert {await _release(pipeline, s) for s in sessions[:20]} == {("stable", "tandem-standard")}

    _weights(weights, 10)
    first = [(await _release(pipeline, s))[0] for s in sessions]
    assert 5 <= first.count("candidate") <= 40
    assert first == [(await _release(pipeline, s))[0] for s in sessions]  # sticky
    assert ("candidate", "tandem-standard-candidate") in {await _release(pipeline, s) for s in sessions}

    _weights(weights, 50)
    second = [(await _release(pipeline, s))[0] for s in sessions]
    # Raising the weight only moves stable clients over, never back.
    assert all(b == "candidate" for a, b in zip(first, second, strict=True) if a == "candidate")
    assert second.count("candidate") > first.count("candidate")


async def test_candidate_id_pins_the_candidate(tmp_path: Path) -> None:
    pipeline = RequestPipeline(GatewayPolicy(), TARGETS, weights_file=str(tmp_path / "none.json"))
    assert await _release(pipeline, "a", "tandem-fast-candidate") == ("candidate", "tandem-fast-candidate")


def test_corrupt_weights_keep_the_last_good_split(tmp_path: Path) -> None:
    weights = tmp_path / "weights.json"
    splitter = ReleaseSplitter(weights, has_candidate=True)
    _weights(weights, 100)
    assert splitter.release_for("anyone") == "candidate"
    weights.write_text("{not json")
    os.utime(weights, ns=(1, 10**18))
    assert splitter.release_for("anyone") == "candidate"


def test_no_candidate_means_stable(tmp_path: Path) -> None:
    weights = tmp_path / "weights.json"
    _weights(weights, 100)
    assert ReleaseSplitter(weights, has_candidate=False).release_for("anyone") == "stable"


@pytest.mark.parametrize("missing", [True, False])
def test_without_file_everything_is_stable(tmp_path: Path, missing: bool) -> None:
    splitter = ReleaseSplitter(None if missing else tmp_path / "absent.json", has_candidate=True)
    assert splitter.release_for("anyone") == "stable"


async def test_late_candidates_route_by_the_published_weights(tmp_path: Path) -> None:
    """A gateway started without a candidate sends the candidate share to `<stable id>-candidate`, versioned
    from the weights file, once a rollout publishes one."""
    weights = tmp_path / "weights.json"
    stable_only = TARGETS[:2]
    pipeline = RequestPipeline(GatewayPolicy(), stable_only, weights_file=str(weights), late_candidates=True)
    assert await _release(pipeline, "a") == ("stable", "tandem-standard")
    weights.write_text(
        json.dumps({"stable": 0, "candidate": 100, "salt": "s", "releases": {"candidate": {"model": "m@v3"}}})
    )
    assert await _release(pipeline, "a") == ("candidate", "tandem-standard-candidate")
    assert await _release(pipeline, "b", "fast") == ("candidate", "tandem-fast-candidate")
    assert pipeline.late_candidate("fast").version == "m@v3"
    # Its model ids pin it, as a built-in candidate's do; without the option nothing changes.
    assert await _release(pipeline, "c", "tandem-fast-candidate") == ("candidate", "tandem-fast-candidate")
    plain = RequestPipeline(GatewayPolicy(), stable_only, weights_file=str(weights))
    assert await _release(plain, "a") == ("stable", "tandem-standard")
