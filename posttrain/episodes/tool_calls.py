"""Tool calls read exactly as the gateway reads them, and tools offered exactly as the eval offers them.

The served tiers run vLLM's OpenAI layer with ``tool_call_parser`` (``hermes`` by default, see
:class:`serving.tiers.EngineConfig`): a chat completion's text goes through that parser class's
``extract_tool_calls``, and the request's tools reach the chat template as vLLM dumps them. The eval (Inspect's
``openai-api`` provider) sends each family's tools through Inspect's own conversion. Both are reused here rather
than re-implemented, so a policy trained on these episodes meets the same prompt and the same parser when
served.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from posttrain.errors import PosttrainError

ToolSpec = dict[str, Any]


@dataclass(frozen=True)
class ParsedCall:
    """One tool call the policy made: its function name and arguments (``error`` when they are not an object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn after the served parser: its text content and its tool calls (none = a final reply)."""

    content: str | None
    calls: list[ParsedCall]


def served_parser_name(configured: str | None = None) -> str:
    """The vLLM tool parser to read turns with: ``configured``, else the serving tiers' default."""
    if configured:
        return configured
    from serving.tiers import EngineConfig

    name = EngineConfig.model_fields["tool_call_parser"].default
    if not name:
        raise PosttrainError("the serving tiers have no tool_call_parser, so served models cannot call tools")
    return str(name)


def inspect_tool_specs(tools: Sequence[Any]) -> list[ToolSpec]:
    """OpenAI tool definitions of Inspect tools, as the eval's ``openai-api`` provider sends them to the gateway
    (``OpenAICompatibleAPI.tools_to_openai``: extended JSON-schema fields dropped, ``strict`` set)."""
    from inspect_ai.model._openai import openai_chat_tools
    from inspect_ai.tool._tool_util import tool_to_tool_info
    from inspect_ai.util._json import JSON_SCHEMA_EXTENDED_FIELDS

    specs = openai_chat_tools(
        [tool_to_tool_info(tool) for tool in tools], exclude=JSON_SCHEMA_EXTENDED_FIELDS
    )
    for spec in specs:
        spec["function"]["strict"] = True  # the provider's default strict_tools
    return [dict(spec) for spec in specs]


_parsing: contextvars.ContextVar[bool] = contextvars.ContextVar("tandem_parsing_policy_turn", default=False)


class _QuietMalformedTurns(logging.Filter):
    """vLLM's parsers log a malformed call's traceback at ERROR, as a server fault. A policy's malformed turn is
    an ordinary outcome of training (scored as a plain reply, no call), so its record is dropped while
    :meth:`ServedToolCalls.parse` runs; the gateway's own parsing still logs it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _parsing.get()


class ServedToolCalls:
    """The served tool-call protocol for one set of tools: the tool definitions as the chat template receives
    them, and the parser that reads a turn's text into calls."""

    def __init__(self, tokenizer: Any, tools: list[ToolSpec], parser: str | None = None) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        self.tokenizer = tokenizer
        self.parser_name = served_parser_name(parser)
        try:
            self._parser_class = ToolParserManager.get_tool_parser(self.parser_name)
        except KeyError as exc:
            raise PosttrainError(f"vLLM has no tool parser {self.parser_name!r}") from exc
        # The request a served chat completion would carry: the parser reads turns against it, and vLLM's
        # renderer hands the template ``[tool.model_dump() for tool in request.tools]``.
        request = ChatCompletionRequest(
            model="policy",
            messages=[{"role": "user", "content": ""}],
            tools=tools or None,
            tool_choice="auto" if tools else "none",
        )
        parser_log = logging.getLogger(self._parser_class.__module__)
        if not any(isinstance(f, _QuietMalformedTurns) for f in parser_log.filters):
            parser_log.addFilter(_QuietMalformedTurns())
        self.request: Any = self._parser_class(tokenizer, request.tools).adjust_request(request)  # type: ignore[arg-type]
        self.template_tools: list[ToolSpec] | None = (
            [tool.model_dump() for tool in self.request.tools] if self.request.tools else None
        )

    def parse(self, text: str) -> ParsedTurn:
        """The content and tool calls of one assistant turn's text (decoded with special tokens kept, as the
        served parser's ``adjust_request`` asks); malformed calls leave the text as a plain reply, as served."""
        if not self.template_tools:
            return ParsedTurn(content=text, calls=[])
        # One parser per turn, as vLLM makes one per request.
        parser = self._parser_class(self.tokenizer, self.request.tools)
        token = _parsing.set(True)
        try:
            extracted = parser.extract_tool_calls(text, self.request)
        finally:
            _parsing.reset(token)
        if not extracted.tools_called:
            return ParsedTurn(content=extracted.content, calls=[])
        return ParsedTurn(
            content=extracted.content,
            calls=[_call(call.function.name, call.function.arguments) for call in extracted.tool_calls],
        )


def _call(name: str, raw_arguments: str | None) -> ParsedCall:
    """A served call as the eval's client reads it: arguments must be a JSON object (Inspect rejects others)."""
    try:
        arguments = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as exc:
        return ParsedCall(name=name, error=f"arguments are not JSON: {exc}")
    if not isinstance(arguments, dict):
        return ParsedCall(name=name, error=f"arguments must be a JSON object, got {type(arguments).__name__}")
    return ParsedCall(name=name, arguments=arguments)


@lru_cache(maxsize=8)
def _cached_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def load_tokenizer(model_dir: str) -> Any:
    """The policy's tokenizer (chat template included), loaded once per process (Ray workers reuse it)."""
    return _cached_tokenizer(str(model_dir))
