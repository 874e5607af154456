"""Guardrails: Luhn, whole-text and streamed redaction (split at every offset), tool allowlists, SSE."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.guardrails import (
    OutputGuard,
    Redactor,
    RequestOutOfBounds,
    ToolNotAllowed,
    check_body_size,
    check_request_bounds,
    check_requested_tools,
    disallowed_tool_calls,
    luhn_valid,
    prompt_chars,
)
from gateway.policy import GatewayPolicy, RedactionPattern, RequestBounds

VISA = "4111 1111 1111 1111"  # a Luhn-valid test number
NOT_A_CARD = "4111 1111 1111 1112"
API_KEY = "sk-proj-ABCdef1234567890XYZabc"
TEXT = (
    f"Contact jane.doe@example.com or pay with {VISA}; ignore {NOT_A_CARD}. "
    f"Old key: {API_KEY} and tk-abcdefghijklmnopqrstuv. Done."
)


def test_luhn() -> None:
    assert luhn_valid("4111111111111111") and luhn_valid(VISA) and luhn_valid("5500-0000-0000-0004")
    assert not luhn_valid(NOT_A_CARD) and not luhn_valid("1234") and not luhn_valid("0000 0000 0001")


def test_whole_text_redaction_counts_per_pattern() -> None:
    redacted, counts = Redactor().redact(TEXT)
    assert "jane.doe@example.com" not in redacted and VISA not in redacted and API_KEY not in redacted
    assert "tk-abcdefghijklmnopqrstuv" not in redacted
    assert NOT_A_CARD in redacted  # digits that fail the Luhn check are not a card
    assert counts == Counter({"email": 1, "card_number": 1, "api_key": 2})
    assert redacted.startswith("Contact [REDACTED:email] or pay with [REDACTED:card_number];")
    assert redacted.endswith("Done.")
    assert Redactor().redact("nothing to see here") == ("nothing to see here", Counter())


def test_custom_patterns_and_empty_pattern_list() -> None:
    ssn = RedactionPattern(name="ssn", regex=r"\b\d{3}-\d{2}-\d{4}\b", max_length=11)
    redacted, counts = Redactor([ssn]).redact("id 123-45-6789, mail a@b.io")
    assert redacted == "id [REDACTED:ssn], mail a@b.io" and counts == {"ssn": 1}
    assert Redactor([]).redact(TEXT) == (TEXT, Counter())
    with pytest.raises(ValueError, match="regular expression"):
        RedactionPattern(name="bad", regex="(unclosed")
    with pytest.raises(ValueError, match="duplicate"):
        GatewayPolicy.model_validate({"guardrails": {"patterns": [ssn.model_dump(), ssn.model_dump()]}})


def _stream(redactor: Redactor, pieces: list[str]) -> tuple[str, Counter[str]]:
    stream = redactor.stream()
    out = "".join(stream.feed(piece) for piece in pieces) + stream.flush()
    return out, stream.counts


def test_stream_split_at_every_offset_equals_whole_text() -> None:
    redactor = Redactor()
    expected, expected_counts = redactor.redact(TEXT)
    for cut in range(len(TEXT) + 1):
        out, counts = _stream(redactor, [TEXT[:cut], TEXT[cut:]])
        assert out == expected, cut
        assert counts == expected_counts, cut


def test_stream_random_chunking_equals_whole_text() -> None:
    rng = random.Random(7)
    redactor = Redactor()
    texts = [TEXT, TEXT * 3, "x" + API_KEY + "y", "mail:a.b@c.de\n" * 5, "4111111111111111" + "9" * 5]
    for text in texts:
        expected = redactor.redact(text)
        for _ in range(60):
            cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            assert _stream(redactor, pieces) == expected, pieces


def test_stream_holds_back_only_what_could_still_become_a_match() -> None:
    stream = Redactor().stream()
    # Plain prose is released at once except the last word (it could grow into an e-mail address).
    released = stream.feed("The answer is forty two")
    assert released == "The answer is forty "
    assert stream.feed(" and more. ") == "two and more. "
    # An e-mail address split over chunks never leaks a prefix longer than the held word.
    assert stream.feed("write to ops@exa") == "write to "
    assert stream.feed("mple.org now") == "[REDACTED:email] "
    assert stream.flush() == "now"
    assert stream.counts == {"email": 1}


def test_stream_releases_tails_longer_than_any_pattern() -> None:
    pattern = RedactionPattern(name="word", regex=r"secret\w*", max_length=10)
    stream = Redactor([pattern]).stream()
    # "secretxxxx..." keeps growing: the redactor may hold at most max_length characters back.
    released = stream.feed("secret" + "x" * 30)
    assert len(released) >= 36 - 10


def test_requested_tools_outside_allowlist_are_refused() -> None:
    tools = [
        {"type": "function", "function": {"name": "search", "parameters": {}}},
        {"type": "function", "function": {"name": "shell"}},
    ]
    check_requested_tools(tools, None)
    check_requested_tools(tools, ["search", "shell"])
    with pytest.raises(ToolNotAllowed) as caught:
        check_requested_tools(tools, ["search"])
    assert caught.value.status == 403 and caught.value.code == "tool_not_allowed"
    assert caught.value.param == "tools" and "'shell'" in caught.value.message
    assert disallowed_tool_calls([{"function": {"name": "shell"}}, {"function": {}}], ["x"]) == [
        "shell",
        "<unnamed>",
    ]


def _chat(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
    }


def test_guard_json_redacts_and_blocks_tools() -> None:
    guard = OutputGuard(Redactor(), ["search"])
    body = guard.guard_json(_chat(f"mail {API_KEY}", [{"id": "t", "function": {"name": "search"}}]))
    assert body["choices"][0]["message"]["content"] == "mail [REDACTED:api_key]"
    assert guard.counts == {"api_key": 1} and guard.usage == {
        "prompt_tokens": 7,
        "completion_tokens": 5,
        "total_tokens": 12,
    }
    blocked = OutputGuard(None, ["search"])
    with pytest.raises(ToolNotAllowed):
        blocked.guard_json(_chat(None, [{"id": "t", "type": "function", "function": {"name": "rm_rf"}}]))
    assert blocked.blocked_tool == "rm_rf"
    completion = OutputGuard(Redactor(), None).guard_json({"choices": [{"index": 0, "text": "a@b.io"}]})
    assert completion["choices"][0]["text"] == "[REDACTED:email]"


def _sse_chunks(pieces: list[dict[str, Any]]) -> list[str]:
    return [f"data: {json.dumps(piece)}\n\n" for piece in pieces] + ["data: [DONE]\n\n"]


def _delta(content: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    delta: dict[str, Any] = {} if content is None else {"content": content}
    delta |= extra
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


async def _collect(guard: OutputGuard, raw: list[str], regroup: int = 1) -> list[str]:
    # Re-split the byte stream arbitrarily: events may arrive several per piece or cut in half.
    text = "".join(raw)
    size = max(1, len(text) // max(1, regroup * len(raw)))

    async def source() -> AsyncIterator[str]:
        for start in range(0, len(text), size):
            yield text[start : start + size]

    return [event async for event in guard.guard_sse(source())]


def _content(events: list[str]) -> str:
    out = []
    for event in events:
        data = event.removeprefix("data: ").strip()
        if data == "[DONE]":
            continue
        for choice in json.loads(data).get("choices", []):
            out.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(out)


@pytest.mark.parametrize("regroup", [1, 3])
async def test_sse_stream_redacts_a_secret_split_across_events(regroup: int) -> None:
    firsts: list[bool] = []
    guard = OutputGuard(Redactor(), None, on_first_token=lambda: firsts.append(True))
    raw = _sse_chunks(
        [
            _delta(role="assistant"),
            _delta("Your key is sk-proj-ABC"),
            _delta("def1234567890XYZ"),
            _delta("abc, keep it safe."),
            _delta("", finish="stop"),
            {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}},
        ]
    )
    events = await _collect(guard, raw, regroup)
    assert events[-1] == "data: [DONE]\n\n"
    assert _content(events) == "Your key is [REDACTED:api_key], keep it safe."
    assert "sk-proj" not in "".join(events) and "def1234567890XYZ" not in "".join(events)
    assert guard.counts == {"api_key": 1} and firsts == [True]
    assert guard.usage == {"prompt_tokens": 3, "completion_tokens": 9}


async def test_usage_read_but_not_forwarded_when_the_client_did_not_ask() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    raw = _sse_chunks(
        [
            {**_delta("hi"), "usage": None},
            _delta("", finish="stop"),
            {"id": "c1", "choices": [], "usage": usage},
        ]
    )
    hidden = OutputGuard(None, None, forward_usage=False)
    events = await _collect(hidden, raw)
    assert hidden.usage == usage and "usage" not in "".join(events) and len(events) == 3
    shown = OutputGuard(None, None)
    events = await _collect(shown, raw)
    assert shown.usage == usage and '"completion_tokens":2' in events[-2]


async def test_held_text_goes_out_with_the_finish_chunk_even_without_content() -> None:
    guard = OutputGuard(Redactor(), None)
    events = await _collect(guard, _sse_chunks([_delta("write to bob"), {**_delta(finish="stop")}]))
    finish = json.loads(events[-2].removeprefix("data: "))["choices"][0]
    assert finish["finish_reason"] == "stop" and finish["delta"] == {"content": "bob"}
    assert _content(events) == "write to bob" and len(events) == 3
    text_guard = OutputGuard(Redactor(), None)
    raw = _sse_chunks([{"choices": [{"index": 0, "text": "x@y.io", "finish_reason": None}]},
                       {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}])  # fmt: skip
    events = await _collect(text_guard, raw)
    assert json.loads(events[-2].removeprefix("data: "))["choices"][0]["text"] == "[REDACTED:email]"


async def test_blocked_non_streamed_tool_call_still_reports_usage() -> None:
    guard = OutputGuard(None, [])
    with pytest.raises(ToolNotAllowed):
        guard.guard_json(_chat(None, [{"id": "t", "function": {"name": "anything"}}]))
    assert guard.usage is not None and guard.usage["completion_tokens"] == 5


async def test_sse_stream_without_finish_reason_flushes_before_done() -> None:
    guard = OutputGuard(Redactor(), None)
    events = await _collect(guard, _sse_chunks([_delta("reach me at someone@example"), _delta(".com")]))
    assert _content(events) == "reach me at [REDACTED:email]"
    assert events[-1] == "data: [DONE]\n\n" and guard.counts == {"email": 1}


async def test_sse_stream_blocks_a_disallowed_tool_call() -> None:
    closed: list[bool] = []

    async def source() -> AsyncIterator[str]:
        try:
            for event in _sse_chunks(
                [
                    _delta(role="assistant"),
                    _delta(
                        tool_calls=[
                            {
                                "index": 0,
                                "id": "t1",
                                "type": "function",
                                "function": {"name": "delete_repo", "arguments": ""},
                            }
                        ]
                    ),
                    _delta(tool_calls=[{"index": 0, "function": {"arguments": '{"repo": "x"}'}}]),
                    _delta(finish="tool_calls"),
                ]
            ):
                yield event
        finally:
            closed.append(True)

    guard = OutputGuard(None, ["search"])
    events = [event async for event in guard.guard_sse(source())]
    joined = "".join(events)
    assert "delete_repo" not in joined.split('"error"')[0]  # no tool-call chunk went out
    assert "arguments" not in joined
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "tool_not_allowed" and error["type"] == "permission_error"
    assert events[-1] == "data: [DONE]\n\n" and guard.blocked_tool == "delete_repo"
    assert closed == [True]  # the upstream generator was closed, so generation stops


async def test_sse_stream_allows_listed_tools_and_passes_other_events() -> None:
    guard = OutputGuard(Redactor(), ["search"])
    call = {"index": 0, "id": "t1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    raw = _sse_chunks([_delta(tool_calls=[call]), _delta(finish="tool_calls")])
    raw.insert(0, ": keep-alive comment\n\n")
    raw.insert(1, 'data: {"error": {"message": "upstream"}}\n\n')
    events = await _collect(guard, raw)
    assert any('"search"' in event for event in events)
    assert any('"upstream"' in event for event in events)
    assert guard.blocked_tool is None


# -- request bounds ---------------------------------------------------------------------------------
BOUNDS = RequestBounds(max_body_bytes=2048, max_tokens=100, max_n=2, max_messages=3, max_prompt_chars=50)


def test_body_size_bound() -> None:
    check_body_size(None, BOUNDS)
    check_body_size("2048", BOUNDS)
    check_body_size("not-a-number", BOUNDS)
    with pytest.raises(RequestOutOfBounds) as caught:
        check_body_size(2049, BOUNDS)
    assert caught.value.status == 413 and caught.value.code == "request_too_large"


def test_prompt_chars_counts_every_prompt_shape() -> None:
    chat = {"messages": [{"role": "user", "content": "abc"}, {"role": "user", "content": [{"type": "text", "text": "de"}, {"type": "image_url"}]}, {"role": "assistant", "content": None}]}  # fmt: skip
    assert prompt_chars(chat) == 5
    assert prompt_chars({"prompt": "hello"}) == 5
    assert prompt_chars({"prompt": ["ab", "cde"]}) == 5
    assert prompt_chars({"prompt": [1, 2, 3]}) == 3
    assert prompt_chars({"prompt": [[1, 2], [3]]}) == 3


@pytest.mark.parametrize(
    ("payload", "param", "code"),
    [
        ({"max_tokens": 101}, "max_tokens", "invalid_parameter"),
        ({"max_completion_tokens": 500}, "max_completion_tokens", "invalid_parameter"),
        ({"n": 3}, "n", "invalid_parameter"),
        ({"messages": [{"role": "user", "content": "x"}] * 4}, "messages", "too_many_messages"),
        ({"messages": [{"role": "user", "content": "x" * 51}]}, "messages", "prompt_too_long"),
        ({"prompt": "y" * 51}, "prompt", "prompt_too_long"),
    ],
)
def test_request_bounds_name_the_field(payload: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(RequestOutOfBounds) as caught:
        check_request_bounds(payload, BOUNDS)
    assert caught.value.status == 400 and caught.value.param == param and caught.value.code == code


def test_requests_within_bounds_pass() -> None:
    check_request_bounds(
        {"max_tokens": 100, "n": 2, "messages": [{"role": "user", "content": "x" * 50}] * 1}, BOUNDS
    )
    check_request_bounds({"prompt": "y" * 50, "max_tokens": None}, BOUNDS)
