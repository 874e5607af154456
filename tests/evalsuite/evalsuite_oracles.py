"""Scripted mockllm policies that answer evalsuite samples right, wrong or malformed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    ChatMessageUser,
    GenerateConfig,
    ModelOutput,
    ModelUsage,
)
from inspect_ai.tool import ToolChoice, ToolInfo

from evalsuite.schema import TaskInstance

Policy = Callable[[list[ChatMessage], list[ToolInfo], ToolChoice, GenerateConfig], ModelOutput]


def with_usage(policy: Policy) -> Policy:
    """Attach token usage so mockllm does not count tokens with tiktoken (which downloads its encoding)."""

    def wrapped(messages: list[ChatMessage], tools: Any, choice: Any, config: Any) -> ModelOutput:
        output = policy(messages, tools, choice, config)
        output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return output

    return wrapped


def _prompt(messages: list[ChatMessage]) -> str:
    return next(m.text for m in messages if isinstance(m, ChatMessageUser))


def _tool_results(messages: list[ChatMessage]) -> int:
    return sum(1 for m in messages if isinstance(m, ChatMessageTool))


def documents_policy(instances: list[TaskInstance], mode: str, wrong_every: int = 1) -> Policy:
    """mode: right | wrong | malformed; with wrong_every=k only every k-th sample is answered wrongly."""
    by_prompt = {i.prompt: (index, i) for index, i in enumerate(instances)}

    def answer(messages: list[ChatMessage], tools: Any, choice: Any, config: Any) -> ModelOutput:
        index, instance = by_prompt[_prompt(messages)]
        expected = instance.expected["answer"]
        if mode == "malformed":
            return ModelOutput.from_content("mockllm", "The document does not say, sorry.")
        if mode == "wrong" and index % wrong_every == 0:
            wrong = (float(expected) + 7.5) if instance.expected["match"] == "numeric" else f"{expected} Corp"
            return ModelOutput.from_content("mockllm", f"Let me see.\nANSWER: {wrong}")
        return ModelOutput.from_content("mockllm", f"Working through the tables.\nANSWER: {expected}")

    return with_usage(answer)


def agent_policy(instances: list[TaskInstance], extra_calls: list[dict[str, Any]] | None = None) -> Policy:
    """Replays each instance's reference calls (after ``extra_calls``), one tool call per turn."""
    by_prompt = {i.prompt: i for i in instances}

    def act(messages: list[ChatMessage], tools: Any, choice: Any, config: Any) -> ModelOutput:
        instance = by_prompt[_prompt(messages)]
        plan = [*(extra_calls or []), *instance.expected["reference_calls"]]
        done = _tool_results(messages)
        if done < len(plan):
            call = plan[done]
            return ModelOutput.for_tool_call("mockllm", call["name"], call["arguments"])
        return ModelOutput.from_content("mockllm", "Done.")

    return with_usage(act)


def terminal_policy(instances: list[TaskInstance], solve: bool) -> Policy:
    """Looks around with ``ls``, then runs the reference solution (or a wrong command), then stops."""
    by_prompt = {i.prompt: i for i in instances}

    def act(messages: list[ChatMessage], tools: Any, choice: Any, config: Any) -> ModelOutput:
        instance = by_prompt[_prompt(messages)]
        script = instance.expected["reference_solution"] if solve else "echo 0 > answer.txt; ls -R"
        plan = ["ls -la", script]
        done = _tool_results(messages)
        if done < len(plan):
            return ModelOutput.for_tool_call("mockllm", "bash", {"command": plan[done]})
        return ModelOutput.from_content("mockllm", "Finished.")

    return with_usage(act)
