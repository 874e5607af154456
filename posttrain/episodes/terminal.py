"""The terminal family's episodes: the eval's bash tool in a fresh bubblewrap sandbox per episode, scored by the
family's checks run in that same sandbox, shaped as the agent scorer shapes an episode (goal = the share of
checks passed, protocol, step budget). A command that runs into a sandbox limit voids the episode (reward 0,
as for single-turn terminal rollouts)."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from evalsuite.schema import TaskInstance, VerifierResult
from posttrain.config import EpisodeConfig
from posttrain.episodes.environments import (
    CallRecord,
    ToolOutcome,
    budget_and_protocol,
    episode_environment,
    opening_messages,
    shaped_score,
)
from posttrain.episodes.tool_calls import ToolSpec, inspect_tool_specs
from posttrain.formats import limit_verdict

if TYPE_CHECKING:
    from evalsuite.sandbox import BwrapSandboxEnvironment

BASH_TOOL = "bash"


def truncate_output(output: str, max_bytes: int, tool: str = BASH_TOOL) -> str:
    """``output`` as the eval's model would see it: Inspect's own truncation past ``max_bytes``."""
    from inspect_ai.model._call_tools import truncate_tool_output

    truncated = truncate_tool_output(tool, output, max_bytes)
    return truncated.output if truncated is not None else output


class SandboxSession:
    """One episode's sandbox, holding the instance's visible files."""

    def __init__(
        self, instance: TaskInstance, sandbox: BwrapSandboxEnvironment, config: EpisodeConfig
    ) -> None:
        self.instance = instance
        self.sandbox = sandbox
        self.config = config

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        if name != BASH_TOOL:
            return ToolOutcome(error=f"Tool {name} not found")
        command = arguments.get("command")
        if not isinstance(command, str) or set(arguments) != {"command"}:
            return ToolOutcome(error="bash takes one argument, command (a string)")
        try:  # the command line of Inspect's bash tool
            result = await self.sandbox.exec(
                ["bash", "--login", "-c", command], timeout=self.config.tool_timeout_s
            )
        except TimeoutError:
            return ToolOutcome(error="Command timed out before completing.")
        output = (f"{result.stderr}\n" if result.stderr else "") + result.stdout
        return ToolOutcome(content=truncate_output(output, self.config.max_tool_output_bytes))

    async def verdict(self, calls: list[CallRecord]) -> VerifierResult:
        from evalsuite.families.terminal.verifier import verify_terminal_in_sandbox

        if self.sandbox.limits_hit:
            return limit_verdict(self.sandbox.limits_hit)
        checked = await verify_terminal_in_sandbox(self.instance, self.sandbox)
        if self.sandbox.limits_hit:  # the checks run the policy's code too (hidden tests import its module)
            return limit_verdict(self.sandbox.limits_hit)
        shape = budget_and_protocol(calls, self.instance.max_steps)
        return VerifierResult(
            score=shaped_score(checked.score, shape["protocol"], shape["budget"]),
            correct=checked.correct,
            components={
                **{f"check:{k}": v for k, v in checked.components.items()},
                "goal": checked.score,
                **shape,
            },
            explanation=f"{checked.explanation}; {len(calls)} calls (budget {self.instance.max_steps})",
        )

    async def close(self) -> None:
        await self.sandbox.close()


@cache
def _bash_tool_specs() -> list[ToolSpec]:
    from inspect_ai.tool import bash

    return inspect_tool_specs([bash(timeout=30)])  # the terminal task's tool (the timeout is not in its spec)


@episode_environment
class TerminalEnvironment:
    family = "terminal"

    def messages(self, instance: TaskInstance) -> list[dict[str, str]]:
        return opening_messages(self.family, instance)

    def tools(self) -> list[ToolSpec]:
        return _bash_tool_specs()

    def reference_turns(self, instance: TaskInstance) -> list[list[CallRecord]]:
        """The generator's reference script, run as one bash call."""
        script = instance.expected["reference_solution"]
        return [[CallRecord(name=BASH_TOOL, arguments={"command": script})]]

    async def open(self, instance: TaskInstance, config: EpisodeConfig) -> SandboxSession:
        from evalsuite.sandbox import BwrapConfig, BwrapSandboxEnvironment

        sandbox = BwrapSandboxEnvironment(BwrapConfig())
        try:
            for path, contents in instance.files.items():
                await sandbox.write_file(path, contents)
        except BaseException:
            await sandbox.close()
            raise
        return SandboxSession(instance, sandbox, config)
