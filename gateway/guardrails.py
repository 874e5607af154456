"""Guardrails: request bounds on the way in; a per-key tool allowlist and a secret/PII redactor on the way out.

Bounds (body size, max_tokens, n, messages, prompt characters) are checked before anything else and
answer 400/413 naming the field.

A tool call outside the key's allowlist never reaches the client (who would execute it): a whole
response becomes a 403, a stream ends with an OpenAI-style error event. The redactor replaces configured
patterns (API keys, e-mail addresses, Luhn-valid card numbers by default) with ``[REDACTED:<name>]`` in
whole texts and in streams, where it holds back only the tail that could still grow into a match (via
the ``regex`` module's partial matching), so a secret split across two SSE chunks is still caught.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from gateway.errors import GatewayError, error_body
from gateway.keys import PermissionDenied
from gateway.policy import RedactionPattern, RequestBounds, default_redaction_patterns

log = logging.getLogger(__name__)

# Emitted text kept as look-behind context, so '\b' at a chunk boundary sees the previous character.
_CONTEXT_CHARS = 32


# -- request bounds ---------------------------------------------------------------------------------
class RequestOutOfBounds(GatewayError):
    """400 (413 for the body size): a request past the policy's hard limits."""


def check_body_size(content_length: str | int | None, bounds: RequestBounds) -> None:
    """413 when the declared body size exceeds ``max_body_bytes`` (check before parsing the body)."""
    try:
        size = int(content_length) if content_length is not None else 0
    except ValueError:
        return
    if size > bounds.max_body_bytes:
        raise RequestOutOfBounds(
            413,
            f"The request body is {size} bytes; the limit is {bounds.max_body_bytes}.",
            code="request_too_large",
        )


def prompt_chars(payload: Mapping[str, Any]) -> int:
    """Characters of prompt text in a chat (``messages``) or completion (``prompt``) request."""
    total = 0
    for message in payload.get("messages") or []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part.get("text") or "") for part in content if isinstance(part, Mapping))
    prompt = payload.get("prompt")
    prompts = prompt if isinstance(prompt, list) else [prompt]
    for item in prompts:
        # A prompt may be text, or token ids (count one per id).
        if isinstance(item, str | list):
            total += len(item)
        elif isinstance(item, int):
            total += 1
    return total


def check_request_bounds(payload: Mapping[str, Any], bounds: RequestBounds) -> None:
    """400 naming the field when max_tokens, n, the message count or the prompt size is past ``bounds``.

    ``payload`` is the request as a dict (``body.model_dump(exclude_unset=True)``).
    """
    for field in ("max_tokens", "max_completion_tokens"):
        value = payload.get(field)
        if isinstance(value, int) and value > bounds.max_tokens:
            raise RequestOutOfBounds(
                400,
                f"{field} is {value}; the limit is {bounds.max_tokens}.",
                param=field,
                code="invalid_parameter",
            )
    n = payload.get("n")
    if isinstance(n, int) and n > bounds.max_n:
        raise RequestOutOfBounds(
            400, f"n is {n}; the limit is {bounds.max_n}.", param="n", code="invalid_parameter"
        )
    messages = payload.get("messages")
    if isinstance(messages, list) and len(messages) > bounds.max_messages:
        raise RequestOutOfBounds(
            400,
            f"The request has {len(messages)} messages; the limit is {bounds.max_messages}.",
            param="messages",
            code="too_many_messages",
        )
    chars = prompt_chars(payload)
    if chars > bounds.max_prompt_chars:
        raise RequestOutOfBounds(
            400,
            f"The prompt has {chars} characters; the limit is {bounds.max_prompt_chars}.",
            param="messages" if "messages" in payload else "prompt",
            code="prompt_too_long",
        )


# -- tool allowlist ---------------------------------------------------------------------------------
class ToolNotAllowed(PermissionDenied):
    def __init__(self, tool: str, allowed: Sequence[str]) -> None:
        listed = ", ".join(sorted(allowed)) or "none"
        super().__init__(
            f"The model called the tool {tool!r}, which this API key may not use (allowed: {listed}).",
            param="tools",
            code="tool_not_allowed",
        )
        self.tool = tool


def check_requested_tools(tools: Iterable[Any] | None, allowed: Sequence[str] | None) -> None:
    """403 before the call when the request declares a function tool outside ``allowed`` (None: any)."""
    if allowed is None or not tools:
        return
    for tool in tools:
        name = _tool_name(tool)
        if name is not None and name not in allowed:
            raise ToolNotAllowed(name, allowed)


def _tool_name(tool: Any) -> str | None:
    data = tool.model_dump() if hasattr(tool, "model_dump") else tool
    function = data.get("function") if isinstance(data, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def disallowed_tool_calls(tool_calls: Iterable[Any] | None, allowed: Sequence[str] | None) -> list[str]:
    """Names of the calls in ``tool_calls`` (OpenAI message or delta shape) outside ``allowed``."""
    if allowed is None or not tool_calls:
        return []
    names = [_tool_name(call) for call in tool_calls]
    return [name if name is not None else "<unnamed>" for name in names if name not in allowed]


# -- redaction --------------------------------------------------------------------------------------
def luhn_valid(digits: str) -> bool:
    numbers = [int(c) for c in digits if c.isdigit()]
    if len(numbers) < 12:
        return False
    total = 0
    for position, digit in enumerate(reversed(numbers)):
        if position % 2 == 1:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


@dataclass(frozen=True)
class _Match:
    start: int
    end: int
    name: str


class Redactor:
    """Replaces every configured pattern with ``[REDACTED:<name>]``; overlapping matches of different
    patterns resolve to the leftmost, then the longest."""

    def __init__(self, patterns: Sequence[RedactionPattern] | None = None) -> None:
        self.patterns = list(default_redaction_patterns() if patterns is None else patterns)
        self._compiled = [(p, regex.compile(p.regex)) for p in self.patterns]
        self.max_length = max((p.max_length for p in self.patterns), default=0)

    def redact(self, text: str) -> tuple[str, Counter[str]]:
        """The redacted text and the number of redactions per pattern name."""
        counts: Counter[str] = Counter()
        matches, _ = self._matches(text, 0, partial=False)
        return _apply(text, 0, len(text), matches, counts), counts

    def stream(self) -> StreamRedactor:
        return StreamRedactor(self)

    def _matches(self, text: str, pos: int, *, partial: bool) -> tuple[list[_Match], int]:
        """Selected full matches from ``pos``, and where the undecided tail starts (len(text) if none)."""
        candidates: list[_Match] = []
        hold = len(text)
        for pattern, compiled in self._compiled:
            for m in compiled.finditer(text, pos, partial=partial):
                if m.end() == m.start():
                    continue
                # A match touching the end may still grow (or, partial, complete) with the next chunk.
                if partial and (m.partial or m.end() == len(text)):
                    hold = min(hold, m.start())
                    continue
                if pattern.luhn and not luhn_valid(m.group()):
                    continue
                candidates.append(_Match(m.start(), m.end(), pattern.name))
        candidates.sort(key=lambda c: (c.start, -(c.end - c.start)))
        selected: list[_Match] = []
        for candidate in candidates:
            if not selected or candidate.start >= selected[-1].end:
                selected.append(candidate)
        return selected, hold


def _apply(text: str, start: int, end: int, matches: list[_Match], counts: Counter[str]) -> str:
    pieces, cursor = [], start
    for m in matches:
        if m.start < start or m.end > end:
            continue
        pieces.append(text[cursor : m.start])
        pieces.append(f"[REDACTED:{m.name}]")
        counts[m.name] += 1
        cursor = m.end
    pieces.append(text[cursor:end])
    return "".join(pieces)


class StreamRedactor:
    """Redacts a text that arrives in chunks: ``feed`` returns what is safe to send now, ``flush`` the
    rest at the end. The output concatenated equals ``Redactor.redact`` of the whole text."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.counts: Counter[str] = Counter()
        self._context = ""
        self._pending = ""

    def feed(self, chunk: str) -> str:
        if not chunk:
            return ""
        self._pending += chunk
        text = self._context + self._pending
        pos = len(self._context)
        matches, hold = self.redactor._matches(text, pos, partial=True)
        # A tail longer than any pattern can match is released; never cut through a selected match.
        hold = max(hold, len(text) - self.redactor.max_length)
        for m in reversed(matches):
            if m.start < hold < m.end:
                hold = m.start
        if hold <= pos:
            return ""
        released = _apply(text, pos, hold, [m for m in matches if m.end <= hold], self.counts)
        self._pending = text[hold:]
        self._context = text[max(0, hold - _CONTEXT_CHARS) : hold]
        return released

    def flush(self) -> str:
        text = self._context + self._pending
        pos = len(self._context)
        matches, _ = self.redactor._matches(text, pos, partial=False)
        released = _apply(text, pos, len(text), matches, self.counts)
        self._context, self._pending = "", ""
        return released


# -- applying both to responses ---------------------------------------------------------------------
class OutputGuard:
    """Applies the tool allowlist and the redactor to one response, whole or streamed.

    ``counts`` holds redactions per pattern; ``usage`` the last usage block seen; ``on_first_token`` is
    called once, when the first content or tool-call delta passes (for TTFT). With ``forward_usage``
    False, usage blocks are read but not sent on: the gateway can ask the engine for
    ``stream_options.include_usage`` (to settle rate limits) without changing what the client asked for.
    """

    def __init__(
        self,
        redactor: Redactor | None,
        allowed_tools: Sequence[str] | None,
        *,
        on_first_token: Callable[[], None] | None = None,
        forward_usage: bool = True,
    ) -> None:
        self.redactor = redactor
        self.allowed_tools = allowed_tools
        self.on_first_token = on_first_token
        self.forward_usage = forward_usage
        self.counts: Counter[str] = Counter()
        self.usage: dict[str, Any] | None = None
        self.blocked_tool: str | None = None
        self._streams: dict[tuple[int, str], StreamRedactor] = {}
        self._tool_names: dict[tuple[int, int], str] = {}
        self._first_seen = False

    # whole responses
    def guard_json(self, body: dict[str, Any]) -> dict[str, Any]:
        """Check and redact a non-streamed chat or text completion in place; ToolNotAllowed (403)."""
        if isinstance(body.get("usage"), dict):
            self.usage = body["usage"]
        for choice in body.get("choices") or []:
            message = choice.get("message")
            if isinstance(message, dict):
                blocked = disallowed_tool_calls(message.get("tool_calls"), self.allowed_tools)
                if blocked:
                    self.blocked_tool = blocked[0]
                    log.warning("event=tool_call_blocked tool=%r", blocked[0])
                    raise ToolNotAllowed(blocked[0], self.allowed_tools or [])
                for field in ("content", "reasoning_content"):
                    message[field] = self._redact_whole(message.get(field))
            if "text" in choice:
                choice["text"] = self._redact_whole(choice.get("text"))
        return body

    def _redact_whole(self, text: Any) -> Any:
        if self.redactor is None or not isinstance(text, str) or not text:
            return text
        redacted, counts = self.redactor.redact(text)
        self.counts.update(counts)
        return redacted

    # streams
    async def guard_sse(self, source: AsyncIterable[str | bytes]) -> AsyncIterator[str]:
        """Filter an OpenAI SSE stream (``data: {...}\\n\\n`` events, possibly several per piece)."""
        buffer = ""
        last_chunk: dict[str, Any] | None = None
        try:
            async for piece in source:
                buffer += piece.decode() if isinstance(piece, bytes) else piece
                while "\n\n" in buffer:
                    event, buffer = buffer.split("\n\n", 1)
                    data = _event_data(event)
                    if data is None:
                        continue
                    if data == "[DONE]":
                        tail = self._flush_chunk(last_chunk)
                        if tail is not None:
                            yield _sse(tail)
                        yield "data: [DONE]\n\n"
                        return
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        yield f"data: {data}\n\n"
                        continue
                    if not isinstance(chunk, dict) or "choices" not in chunk:
                        yield _sse(chunk)
                        continue
                    blocked = self._guard_chunk(chunk)
                    if not self.forward_usage:
                        chunk.pop("usage", None)
                        if not chunk["choices"]:
                            continue
                    if blocked is not None:
                        yield _sse(
                            error_body(
                                blocked.status, blocked.message, param=blocked.param, code=blocked.code
                            )
                        )
                        yield "data: [DONE]\n\n"
                        return
                    last_chunk = chunk
                    yield _sse(chunk)
            tail = self._flush_chunk(last_chunk)
            if tail is not None:
                yield _sse(tail)
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()

    def _guard_chunk(self, chunk: dict[str, Any]) -> ToolNotAllowed | None:
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = int(choice.get("index", 0))
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for call in delta.get("tool_calls") or []:
                    self._mark_first()
                    name = (call.get("function") or {}).get("name")
                    if name and self.allowed_tools is not None:
                        # A name may arrive in pieces; checking the pieces so far fails closed.
                        slot = (index, int(call.get("index", 0)))
                        self._tool_names[slot] = self._tool_names.get(slot, "") + name
                        if self._tool_names[slot] not in self.allowed_tools:
                            self.blocked_tool = self._tool_names[slot]
                            log.warning("event=tool_call_blocked tool=%r", self.blocked_tool)
                            return ToolNotAllowed(self.blocked_tool, self.allowed_tools)
                for field in ("content", "reasoning_content"):
                    if isinstance(delta.get(field), str):
                        if delta[field]:
                            self._mark_first()
                        delta[field] = self._redact_piece(index, field, delta[field])
            if isinstance(choice.get("text"), str):
                if choice["text"]:
                    self._mark_first()
                choice["text"] = self._redact_piece(index, "text", choice["text"])
            if choice.get("finish_reason") is not None:
                # The choice is complete: whatever was held back goes out with its final chunk.
                for held in sorted(held for held in self._streams if held[0] == index):
                    released = self._close_stream(held)
                    if held[1] == "text":
                        choice["text"] = (choice.get("text") or "") + released
                    elif released:
                        target = choice.setdefault("delta", {})
                        target[held[1]] = (target.get(held[1]) or "") + released
        return None

    def _redact_piece(self, index: int, field: str, text: str) -> str:
        if self.redactor is None:
            return text
        return self._streams.setdefault((index, field), self.redactor.stream()).feed(text)

    def _close_stream(self, slot: tuple[int, str]) -> str:
        stream = self._streams.pop(slot, None)
        if stream is None:
            return ""
        released = stream.flush()
        self.counts.update(stream.counts)
        return released

    def _flush_chunk(self, template: dict[str, Any] | None) -> dict[str, Any] | None:
        """A final chunk carrying text still held back when the stream ended without a finish_reason."""
        choices = []
        for slot in sorted(self._streams):
            released = self._close_stream(slot)
            if not released:
                continue
            index, field = slot
            if field == "text":
                choices.append({"index": index, "text": released, "finish_reason": None})
            else:
                choices.append({"index": index, "delta": {field: released}, "finish_reason": None})
        if not choices:
            return None
        base = {k: v for k, v in (template or {}).items() if k in ("id", "object", "created", "model")}
        return base | {"choices": choices}

    def _mark_first(self) -> None:
        if not self._first_seen:
            self._first_seen = True
            if self.on_first_token is not None:
                self.on_first_token()


def _event_data(event: str) -> str | None:
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith("data:")]
    return "\n".join(lines) if lines else None


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
