"""The traffic family's Inspect task: replay a private eval set's prompts (messages and tools) against a model.

Each sample is one :class:`EvalSetItem`; its id is the item id, so two models' logs of one set pair up item by
item (``read_answers``). The request is replayed as it was asked: its messages, its tools (offered, never
run: the model's tool calls are the answer) and a ``json_schema`` response format as Inspect's structured
output.

Scoring: an item with a signal gets a 0-1 score (``verifier.verify_json`` / ``verify_tool_calls``). An item
without one gets the score value NaN with ``reason="needs_review"`` and ``metadata["needs_review"]``: Inspect
leaves NaN scores out of every metric and counts them as the scorer's ``unscored_samples``, so the family's
``mean`` (and ``correct_rate``) is over the automatically scored items only, and the rest go to human review.
"""

from __future__ import annotations

import json
import logging
import math
import random
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    ResponseSchema,
)
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import ToolCall, ToolChoice, ToolDef, ToolFunction, ToolParams
from inspect_ai.util import JSONSchema
from pydantic import ValidationError

from evalsuite.errors import EvalError
from evalsuite.families.traffic.items import SET_SPLITS, EvalSetItem, load_set
from evalsuite.families.traffic.verifier import response_schema, verify_json, verify_tool_calls
from evalsuite.inspect_task import correct_rate

log = logging.getLogger(__name__)

FAMILY = "traffic"
ITEM_KEY = "traffic_item"
SET_KEY = "set_ref"
NEEDS_REVIEW = "needs_review"


# -- OpenAI shapes -> Inspect -------------------------------------------------------------------------
def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def _tool_call(call: dict[str, Any]) -> ToolCall:
    function = call.get("function") or {}
    raw = function.get("arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else (raw or {})
    except json.JSONDecodeError:
        arguments = {}
    return ToolCall(
        id=str(call.get("id") or ""),
        function=str(function.get("name") or ""),
        arguments=arguments if isinstance(arguments, dict) else {},
    )


def to_inspect_messages(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    """OpenAI chat messages (text content; image parts dropped) as Inspect messages."""
    converted: list[ChatMessage] = []
    for message in messages:
        role, text = message.get("role"), _text(message.get("content"))
        if role in ("system", "developer"):
            converted.append(ChatMessageSystem(content=text))
        elif role == "assistant":
            calls = [_tool_call(c) for c in message.get("tool_calls") or []]
            converted.append(ChatMessageAssistant(content=text, tool_calls=calls or None))
        elif role == "tool":
            converted.append(ChatMessageTool(content=text, tool_call_id=message.get("tool_call_id")))
        else:
            converted.append(ChatMessageUser(content=text))
    return converted


async def _not_executed(**_: Any) -> str:
    """Replayed tools are offered, never run: the model's call is the answer being judged."""
    raise EvalError("tools of a replayed traffic item are not executed")


def to_tool_defs(tools: list[dict[str, Any]] | None) -> list[ToolDef]:
    """OpenAI function tools as Inspect tool definitions (a schema Inspect cannot hold is offered without
    its parameters, and the verifier still checks against the original)."""
    defs = []
    for tool in tools or []:
        function = tool.get("function") or {}
        name = function.get("name")
        if not isinstance(name, str):
            continue
        schema = dict(function.get("parameters") or {})
        # Inspect requires a description per parameter; OpenAI does not. The name stands in for a missing one.
        schema["properties"] = {
            key: {"description": key, **value} if isinstance(value, dict) else value
            for key, value in (schema.get("properties") or {}).items()
        }
        try:
            parameters = ToolParams.model_validate(schema)
        except ValidationError as exc:
            log.warning("event=traffic_tool_schema_unsupported tool=%s error=%s", name, str(exc)[:200])
            parameters = ToolParams()
        defs.append(ToolDef(_not_executed, name=name, description=function.get("description") or name,
                            parameters=parameters))  # fmt: skip
    return defs


def to_tool_choice(choice: Any) -> ToolChoice | None:
    if choice in ("auto", "none"):
        return choice  # type: ignore[no-any-return]
    if choice == "required":
        return "any"
    if isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        return ToolFunction(name=choice["function"]["name"])
    return None


def openai_tool_calls(calls: list[ToolCall] | None) -> list[dict[str, Any]] | None:
    """Inspect tool calls in the OpenAI shape (arguments as JSON text)."""
    if not calls:
        return None
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.function, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]


# -- dataset, solver, scorer --------------------------------------------------------------------------
def to_sample(item: EvalSetItem, set_ref: str) -> Sample:
    return Sample(
        id=item.id,
        input=to_inspect_messages(item.messages),
        metadata={ITEM_KEY: item.model_dump(mode="json"), SET_KEY: set_ref, "signal": item.signal},
    )


def item_of(state: TaskState) -> EvalSetItem:
    return EvalSetItem.model_validate(state.metadata[ITEM_KEY])


@solver
def replay() -> Solver:
    """One model turn on the item's request: its tools offered (not run), its JSON schema enforced."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        item = item_of(state)
        state.tools = [tool.as_tool() for tool in to_tool_defs(item.tools)]
        choice = to_tool_choice(item.tool_choice)
        if choice is not None and state.tools:
            state.tool_choice = choice
        schema = response_schema(item.response_format)
        if schema is not None:
            spec = (item.response_format or {}).get("json_schema") or {}
            try:
                structured = ResponseSchema(
                    name=str(spec.get("name") or "response"),
                    json_schema=JSONSchema.model_validate(schema),
                    strict=spec.get("strict"),
                )
            except ValidationError as exc:
                log.warning("event=traffic_response_schema_unsupported error=%s", str(exc)[:200])
            else:
                return await generate(state, tool_calls="none", response_schema=structured)
        return await generate(state, tool_calls="none")

    return solve


@scorer(metrics=[mean(), stderr(), correct_rate()])
def traffic_scorer() -> Scorer:
    """JSON validity (and schema) or tool-call validity by the item's signal; NaN (needs review) without one."""

    async def score(state: TaskState, target: Target) -> Score:
        item = item_of(state)
        message = state.output.message if state.output and state.output.choices else None
        answer = state.output.completion if state.output else ""
        calls = openai_tool_calls(message.tool_calls if message else None)
        if item.signal is None:
            return Score(
                value=math.nan,
                answer=answer[-200:],
                reason=NEEDS_REVIEW,
                explanation="no verifiable signal: judged by human review",
                metadata={NEEDS_REVIEW: True, "signal": None},
            )
        result = (
            verify_json(answer, item.response_format)
            if item.signal == "json"
            else verify_tool_calls(calls, item.tools)
        )
        return Score(
            value=result.score,
            answer=answer[-200:],
            explanation=result.explanation,
            metadata={
                NEEDS_REVIEW: False,
                "signal": item.signal,
                "correct": result.correct,
                "components": result.components,
            },
        )

    return score


@task
def traffic(
    set: str = "",  # the option's public name: --family-option traffic.set=...
    split: str = "test",
    n: int = 20,
    seed: int = 0,
    registry: str | None = None,
) -> Task:
    """Replay the eval set ``set`` (``traffic-NAME@PERIOD``) from the registry: ``n`` items of ``split``
    (a seeded sample when the split has more)."""
    if not set:
        raise EvalError("the traffic family needs an eval set: --traffic-set traffic-NAME@PERIOD")
    if split not in SET_SPLITS:
        raise EvalError(f"traffic eval sets have the splits {', '.join(SET_SPLITS)}, not {split!r}")
    manifest, items = load_set(set, registry)
    chosen = [item for item in items if item.split == split]
    if not chosen:
        raise EvalError(f"eval set {manifest.ref} has no {split!r} items")
    if len(chosen) > n:
        chosen = sorted(random.Random(seed).sample(chosen, n), key=lambda item: item.id)
        log.info("event=traffic_sampled ref=%s split=%s items=%d of=%d", manifest.ref, split, n, len(items))
    return Task(
        dataset=MemoryDataset(
            [to_sample(item, manifest.ref) for item in chosen], name=f"{manifest.ref}-{split}"
        ),
        solver=[replay()],
        scorer=traffic_scorer(),
        name=FAMILY,
        metadata={SET_KEY: manifest.ref, "split": split},
    )
