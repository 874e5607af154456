"""The agent family's episodes: a fresh simulated shop per episode, its tools as the eval offers them, and the
family's own verifier (goal state, protocol, budget; nothing for a forbidden call)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from evalsuite.families.agent.shop import Shop, ShopRejected, ShopState
from evalsuite.families.agent.verifier import AgentTrace, ToolCallRecord, verify_agent
from evalsuite.schema import TaskInstance, VerifierResult
from posttrain.config import EpisodeConfig
from posttrain.episodes.environments import CallRecord, ToolOutcome, episode_environment, opening_messages
from posttrain.episodes.tool_calls import ToolSpec, inspect_tool_specs


class ShopSession:
    """One episode's shop, built from the instance's initial state."""

    def __init__(self, instance: TaskInstance) -> None:
        self.instance = instance
        self.shop = Shop(ShopState.model_validate(instance.expected["initial_state"]))

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        # As the eval's shop tools do: a rejected call is a tool error the model sees.
        try:
            return ToolOutcome(content=json.dumps(self.shop.call(name, arguments)))
        except ShopRejected as exc:
            return ToolOutcome(error=str(exc))

    async def verdict(self, calls: list[CallRecord]) -> VerifierResult:
        trace = AgentTrace(
            final_state=self.shop.state.model_dump(),
            calls=[ToolCallRecord(name=c.name, arguments=c.arguments, error=c.error) for c in calls],
        )
        return verify_agent(self.instance, trace)

    async def close(self) -> None:
        return None


@cache
def _shop_tool_specs() -> list[ToolSpec]:
    from evalsuite.families.agent.task import shop_tools

    # The definitions do not depend on the shop the tools would act on; executing goes through ShopSession.
    placeholder = Shop(ShopState(customers={}, orders={}, products={}))
    return inspect_tool_specs(shop_tools(placeholder))


@episode_environment
class AgentEnvironment:
    family = "agent"

    def messages(self, instance: TaskInstance) -> list[dict[str, str]]:
        return opening_messages(self.family, instance)

    def tools(self) -> list[ToolSpec]:
        return _shop_tool_specs()

    def reference_turns(self, instance: TaskInstance) -> list[list[CallRecord]]:
        """The reference solution's calls (looked up before acting), one per turn as the eval's loop runs."""
        return [[CallRecord.model_validate(call)] for call in instance.expected["reference_calls"]]

    async def open(self, instance: TaskInstance, config: EpisodeConfig) -> ShopSession:
        return ShopSession(instance)
