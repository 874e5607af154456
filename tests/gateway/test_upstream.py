"""litellm upstreams: a tier's fallback when its local engine dies, against a real second OpenAI server.

The local tier is a ``call`` that raises vLLM's own ``EngineDeadError``; the upstream is vLLM's
OpenAI-compatible server (the ``upstream_server`` fixture) reached through litellm. Requests go through
the gateway's FastAPI app (OpenAI error handlers, body parsing) and the real ``RequestPipeline``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI, Request
from pydantic import ValidationError
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest
from starlette.responses import JSONResponse, Response

from gateway.config import TandemConfig
from gateway.ingress import create_fastapi_app
from gateway.pipeline import RequestPipeline, TierTarget
from gateway.policy import GatewayPolicy
from infra.config import load_model_file
from infra.errors import ConfigError
from tests.conftest import free_port
from tests.gateway.conftest import OpenAIServer

KEY_ENV = "TANDEM_TEST_UPSTREAM_KEY"
TOKENS_PER_MINUTE = 100_000
NOW = 1_000_000.0  # the rate limiter's clock, frozen so bucket levels are exact
TARGETS = [
    TierTarget("standard", "tandem-standard", ("standard",), "m@v1"),
    TierTarget("fast", "tandem-fast", ("fast",), "m@v1+ngram"),
]
EMAIL = "alice@example.com"
BOTH = ("tandem-standard", "tandem-fast")
CHAT = {"model": "standard", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


class LocalTier:
    """The local engines: each call fails as a dead vLLM engine does while ``dead`` names its model id."""

    def __init__(self, dead: tuple[str, ...] = ("tandem-standard",)) -> None:
        self.dead = dead
        self.calls: list[str] = []

    async def __call__(self, body: Any, _: Request) -> Response:
        from vllm.v1.engine.exceptions import EngineDeadError

        self.calls.append(body.model)
        if body.model in self.dead:
            raise EngineDeadError("EngineCore encountered an issue.")
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        message = {"role": "assistant", "content": "local"}
        return JSONResponse({"model": body.model, "choices": [{"index": 0, "message": message}], "usage": usage})  # fmt: skip


class Gateway:
    """The gateway's FastAPI app around a ``RequestPipeline`` whose local tiers are ``local``."""

    def __init__(self, tmp_path: Path, upstream: dict[str, Any] | None, local: LocalTier) -> None:
        policy = GatewayPolicy.model_validate(
            {
                "auth": {"mode": "keys", "key_store": str(tmp_path / "keys.db")},
                "limits": {"requests_per_minute": 1000, "tokens_per_minute": TOKENS_PER_MINUTE},
                "upstreams": {"standard": upstream} if upstream else {},
            }
        )
        self.pipeline = RequestPipeline(policy, TARGETS)
        assert self.pipeline.limiter is not None and self.pipeline.key_store is not None
        self.pipeline.limiter.clock = lambda: NOW
        self.key = self.pipeline.key_store.create("tests", "upstream tests")
        self.local = local
        app: FastAPI = create_fastapi_app(policy)

        @app.post("/v1/chat/completions")
        async def chat(body: ChatCompletionRequest, request: Request) -> Response:
            return await self.pipeline.handle(body, request, self.local, "chat")

        @app.post("/v1/completions")
        async def completions(body: CompletionRequest, request: Request) -> Response:
            return await self.pipeline.handle(body, request, self.local, "text_completion")

        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://gateway",
            headers={"Authorization": f"Bearer {self.key.key}"},
            timeout=300,
        )

    async def post(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        return await self.client.post(path, json=payload)

    def tokens_left(self) -> float:
        """The key's tokens/minute bucket as stored (settled usage included)."""
        assert self.pipeline.key_store is not None
        with self.pipeline.key_store.database.transaction() as cursor:
            cursor.execute(
                "SELECT level FROM tandem_rate_buckets WHERE key_id = ? AND kind = ?",
                (self.key.record.key_id, "tokens"),
            )
            return float(cursor.fetchone()[0])


def _upstream(server: OpenAIServer, **overrides: Any) -> dict[str, Any]:
    return {
        "model": f"hosted_vllm/{server.model}",
        "api_base": server.base_url,
        "api_key_env": KEY_ENV,
        "timeout_s": 120,
        "cooldown_s": 60,
    } | overrides


def _events(response: httpx.Response) -> list[Any]:
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", response.text[-500:]
    return [json.loads(event) for event in events[:-1]]


@pytest.fixture
def upstream_key(upstream_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, upstream_server.api_key)
    return upstream_server.api_key


# -- against vLLM's OpenAI server -------------------------------------------------------------------
@pytest.mark.integration
async def test_dead_engine_is_answered_by_the_upstream(
    upstream_server: OpenAIServer, upstream_key: str, tmp_path: Path
) -> None:
    local = LocalTier()
    gateway = Gateway(tmp_path, _upstream(upstream_server), local)
    # ignore_eos (a vLLM extension, sent in the body) makes the completion exactly max_tokens long.
    response = await gateway.post("/v1/chat/completions", CHAT | {"ignore_eos": True})
    assert response.status_code == 200, response.text
    assert local.calls == ["tandem-standard"]
    assert response.headers["x-tandem-tier"] == "standard"
    assert response.headers["x-tandem-route-reason"] == "standard_unavailable_upstream"
    assert response.headers["x-tandem-version"] == f"upstream:hosted_vllm/{upstream_server.model}"
    body = response.json()
    assert body["model"] == "tandem-standard" and body["object"] == "chat.completion"
    assert isinstance(body["choices"][0]["message"]["content"], str)
    usage = body["usage"]
    assert usage["completion_tokens"] == 8 and usage["total_tokens"] > 8
    # Usage settled: the bucket is charged exactly what the upstream reports, not the estimate.
    assert gateway.tokens_left() == TOKENS_PER_MINUTE - usage["total_tokens"]
    assert response.headers["x-ratelimit-remaining-tokens"] == str(TOKENS_PER_MINUTE - usage["total_tokens"])


@pytest.mark.integration
async def test_streams_from_the_upstream_settle_usage(
    upstream_server: OpenAIServer, upstream_key: str, tmp_path: Path
) -> None:
    gateway = Gateway(tmp_path, _upstream(upstream_server), LocalTier())
    # Without include_usage the client gets no usage chunk, yet the gateway settles the real usage.
    response = await gateway.post("/v1/chat/completions", CHAT | {"stream": True, "ignore_eos": True})
    assert response.status_code == 200, response.text
    assert response.headers["x-tandem-route-reason"] == "standard_unavailable_upstream"
    chunks = _events(response)
    assert chunks and all(chunk["model"] == "tandem-standard" for chunk in chunks)
    assert all(chunk["object"] == "chat.completion.chunk" and "usage" not in chunk for chunk in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text
    charged = TOKENS_PER_MINUTE - gateway.tokens_left()
    assert 8 < charged < 8 + 64  # the prompt's tokens plus the 8 completion tokens

    with_usage = await gateway.post(
        "/v1/chat/completions",
        CHAT | {"stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}},
    )
    usage = _events(with_usage)[-1]["usage"]
    assert usage["completion_tokens"] == 8 and usage["total_tokens"] == charged


@pytest.mark.integration
async def test_text_completions_from_the_upstream(
    upstream_server: OpenAIServer, upstream_key: str, tmp_path: Path
) -> None:
    gateway = Gateway(tmp_path, _upstream(upstream_server), LocalTier())
    prompt = {"model": "standard", "prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": True}
    whole = await gateway.post("/v1/completions", prompt)
    assert whole.status_code == 200, whole.text
    body = whole.json()
    assert body["object"] == "text_completion" and isinstance(body["choices"][0]["text"], str)
    assert body["usage"]["completion_tokens"] == 6
    streamed = await gateway.post(
        "/v1/completions", prompt | {"stream": True, "stream_options": {"include_usage": True}}
    )
    chunks = _events(streamed)
    assert streamed.headers["x-tandem-route-reason"] == "standard_unavailable_upstream"
    assert "".join(c["choices"][0].get("text") or "" for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] == 6


@pytest.mark.integration
@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_answers_are_redacted(
    upstream_server: OpenAIServer, upstream_key: str, tmp_path: Path, stream: bool
) -> None:
    gateway = Gateway(tmp_path, _upstream(upstream_server), LocalTier())
    # A regex constraint makes the random model write exactly an e-mail address.
    forced = CHAT | {
        "max_tokens": 32,
        "stream": stream,
        "structured_outputs": {"regex": r"alice@example\.com"},
    }
    response = await gateway.post("/v1/chat/completions", forced)
    assert response.status_code == 200, response.text
    if stream:
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in _events(response) if c["choices"]
        )
    else:
        text = response.json()["choices"][0]["message"]["content"]
    assert text == "[REDACTED:email]"


@pytest.mark.integration
async def test_circuit_breaker_skips_the_dead_engine_until_the_cooldown_ends(
    upstream_server: OpenAIServer, upstream_key: str, tmp_path: Path
) -> None:
    local = LocalTier()
    gateway = Gateway(tmp_path, _upstream(upstream_server, cooldown_s=3), local)
    first = await gateway.post("/v1/chat/completions", CHAT)
    assert first.status_code == 200 and local.calls == ["tandem-standard"]
    local.dead = ()  # the engine is back, but the breaker is open: the next request skips it
    second = await gateway.post("/v1/chat/completions", CHAT)
    assert second.status_code == 200 and local.calls == ["tandem-standard"]
    assert second.headers["x-tandem-route-reason"] == "standard_unavailable_upstream"
    await asyncio.sleep(3.2)
    third = await gateway.post("/v1/chat/completions", CHAT)
    assert third.status_code == 200 and local.calls == ["tandem-standard"] * 2
    assert third.headers["x-tandem-route-reason"] == "requested"
    assert (
        third.headers["x-tandem-version"] == "m@v1"
        and third.json()["choices"][0]["message"]["content"] == "local"
    )


@pytest.mark.integration
async def test_upstream_refusing_the_key_is_a_clean_502(
    upstream_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "not-the-key")
    gateway = Gateway(tmp_path, _upstream(upstream_server), LocalTier(dead=BOTH))
    response = await gateway.post("/v1/chat/completions", CHAT)
    assert response.status_code == 502
    assert response.json() == {
        "error": {
            "message": "The fallback upstream refused the gateway's credentials.",
            "type": "server_error",
            "param": None,
            "code": "upstream_auth_failed",
        }
    }
    # A failed request is not charged.
    assert gateway.tokens_left() == TOKENS_PER_MINUTE


@pytest.mark.integration
async def test_slow_upstream_is_a_504(
    upstream_server: OpenAIServer, upstream_key: str, tmp_path: Path
) -> None:
    gateway = Gateway(tmp_path, _upstream(upstream_server, timeout_s=0.001), LocalTier(dead=BOTH))
    response = await gateway.post("/v1/chat/completions", CHAT)
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "upstream_timeout"


# -- without a server -------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_unreachable_upstream_is_a_clean_503(tmp_path: Path, stream: bool) -> None:
    closed = {
        "model": "hosted_vllm/nobody",
        "api_base": f"http://127.0.0.1:{free_port()}/v1",
        "timeout_s": 10,
    }
    local = LocalTier(dead=BOTH)
    gateway = Gateway(tmp_path, closed, local)
    response = await gateway.post("/v1/chat/completions", CHAT | {"stream": stream})
    assert local.calls == ["tandem-standard", "tandem-fast"]  # the engine, the upstream, the other tier
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "5"
    assert response.json() == {
        "error": {
            "message": "The fallback upstream is unreachable.",
            "type": "server_error",
            "param": None,
            "code": "upstream_unreachable",
        }
    }
    assert gateway.tokens_left() == TOKENS_PER_MINUTE


async def test_missing_key_variable_is_a_clean_502(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    upstream = {"model": "openai/gpt-4o-mini", "api_base": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV}
    response = await Gateway(tmp_path, upstream, LocalTier(dead=BOTH)).post("/v1/chat/completions", CHAT)
    assert response.status_code == 502
    assert (
        response.json()["error"]["message"]
        == f"The fallback upstream is misconfigured: ${KEY_ENV} is not set."
    )


async def test_without_an_upstream_the_other_tier_takes_over(tmp_path: Path) -> None:
    local = LocalTier(dead=("tandem-fast",))
    gateway = Gateway(tmp_path, None, local)
    response = await gateway.post("/v1/chat/completions", CHAT | {"model": "fast"})
    assert response.status_code == 200 and local.calls == ["tandem-fast", "tandem-standard"]
    assert response.headers["x-tandem-tier"] == "standard"
    assert response.headers["x-tandem-route-reason"] == "fast_unavailable"


async def test_a_failed_upstream_falls_back_to_the_other_tier(tmp_path: Path) -> None:
    closed = {
        "model": "hosted_vllm/nobody",
        "api_base": f"http://127.0.0.1:{free_port()}/v1",
        "cooldown_s": 60,
    }
    local = LocalTier()  # the standard engine is dead and its upstream unreachable: the fast tier answers
    gateway = Gateway(tmp_path, closed, local)
    for _ in range(2):  # the second skips the dead engine (breaker open), then the upstream fails too
        response = await gateway.post("/v1/chat/completions", CHAT)
        assert response.status_code == 200, response.text
        assert response.headers["x-tandem-tier"] == "fast"
        assert response.headers["x-tandem-route-reason"] == "standard_unavailable"
        assert response.json()["choices"][0]["message"]["content"] == "local"
    assert local.calls == ["tandem-standard", "tandem-fast", "tandem-fast"]


async def test_an_upstream_serves_only_its_own_tier(tmp_path: Path) -> None:
    # The standard tier has an (unreachable) upstream; the fast tier's death still fails over locally.
    closed = {"model": "hosted_vllm/nobody", "api_base": f"http://127.0.0.1:{free_port()}/v1"}
    local = LocalTier(dead=("tandem-fast",))
    response = await Gateway(tmp_path, closed, local).post("/v1/chat/completions", CHAT | {"model": "fast"})
    assert response.status_code == 200 and response.headers["x-tandem-route-reason"] == "fast_unavailable"


async def test_other_engine_errors_do_not_go_upstream(tmp_path: Path) -> None:
    closed = {"model": "hosted_vllm/nobody", "api_base": f"http://127.0.0.1:{free_port()}/v1"}
    gateway = Gateway(tmp_path, closed, LocalTier())

    async def broken(body: Any, _: Request) -> Response:
        raise ValueError("a bug, not an outage")

    gateway.local = broken  # type: ignore[assignment]
    with pytest.raises(ValueError, match="a bug"):
        await gateway.post("/v1/chat/completions", CHAT)


# -- configuration ----------------------------------------------------------------------------------
def _load(tmp_path: Path, gateway: dict[str, Any], tiers: list[dict[str, Any]] | None = None) -> TandemConfig:
    config: dict[str, Any] = {"gateway": gateway}
    if tiers is not None:
        config["tiers"] = tiers
    path = tmp_path / "tandem.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_model_file(path, TandemConfig)


def test_upstream_config_parses_with_defaults(tmp_path: Path) -> None:
    config = _load(
        tmp_path, {"upstreams": {"fast": {"model": "openai/gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}}}
    )
    upstream = config.gateway.upstreams["fast"]
    assert upstream.api_base is None and upstream.timeout_s == 60.0 and upstream.cooldown_s == 30.0
    # The policy travels to the ingress as JSON and back.
    assert (
        GatewayPolicy.model_validate(config.gateway.model_dump(mode="json")).upstreams
        == config.gateway.upstreams
    )


@pytest.mark.parametrize(
    ("upstream", "names"),
    [
        ({"model": "gpt-4o-mini"}, "gateway.upstreams.standard.model: String should match pattern"),
        ({"model": "openai/x", "api_base": "localhost:8000"}, "gateway.upstreams.standard.api_base"),
        ({"model": "openai/x", "api_key_env": "my key"}, "gateway.upstreams.standard.api_key_env"),
        (
            {"model": "openai/x", "timeout_s": 0},
            "gateway.upstreams.standard.timeout_s: Input should be greater than 0",
        ),
        ({"model": "openai/x", "cooldown_s": -1}, "gateway.upstreams.standard.cooldown_s"),
        (
            {"model": "openai/x", "retries": 3},
            "gateway.upstreams.standard.retries: Extra inputs are not permitted",
        ),
        ({"model": "openai/x", "api_key": "sk-secret"}, "name that variable in `api_key_env`"),
    ],
)
def test_invalid_upstream_config_names_the_field(
    tmp_path: Path, upstream: dict[str, Any], names: str
) -> None:
    with pytest.raises(ConfigError, match=r"tandem\.yaml") as raised:
        _load(tmp_path, {"upstreams": {"standard": upstream}})
    assert names in str(raised.value)


def test_upstream_for_an_unknown_or_missing_tier(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gateway\.upstreams\.turbo") as raised:
        _load(tmp_path, {"upstreams": {"turbo": {"model": "openai/x"}}})
    assert "'standard', 'fast' or 'long'" in str(raised.value)
    only_standard = [{"name": "standard", "model_id": "tandem-standard"}]
    with pytest.raises(ConfigError) as missing:
        _load(tmp_path, {"upstreams": {"fast": {"model": "openai/x"}}}, only_standard)
    assert "gateway.upstreams.fast: no tier named 'fast' is configured" in str(missing.value)


def test_shipped_config_and_its_commented_upstream_example_load() -> None:
    from gateway.config import DEFAULT_CONFIG_PATH, load_config

    assert load_config(DEFAULT_CONFIG_PATH).gateway.upstreams == {}
    lines = DEFAULT_CONFIG_PATH.read_text().splitlines()
    start = lines.index("# gateway:")
    example = [line[2:] for line in lines[start:] if line.startswith("# ")]
    upstream = TandemConfig.model_validate(yaml.safe_load("\n".join(example))).gateway.upstreams["standard"]
    assert upstream.api_key_env == "TANDEM_UPSTREAM_API_KEY" and upstream.cooldown_s == 30
    with pytest.raises(ValidationError):
        GatewayPolicy.model_validate({"upstreams": {"standard": {}}})
