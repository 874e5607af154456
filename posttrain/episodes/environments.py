"""Episode environments: what a family's tools do during post-training, one registered adapter per family.

An adapter reuses its eval family's own pieces (system prompt, tools, environment, verifier) and opens one
fresh :class:`EpisodeSession` per episode (its own shop, its own sandbox). A third-party family registers one
with :func:`episode_environment`; the pool then rolls that family out as multi-turn episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, Field

from evalsuite.schema import TaskInstance, VerifierResult
from posttrain.config import EpisodeConfig
from posttrain.episodes.tool_calls import ToolSpec
from posttrain.errors import UnsupportedFamily


class ToolOutcome(BaseModel):
    """What one executed call returned: the tool turn's text, or the environment's rejection."""

    content: str = ""
    error: str | None = None

    def message_text(self) -> str:
        """The ``tool`` turn's content, as the eval's client sends a tool result or error to the model."""
        return f"Error: {self.error}" if self.error is not None else self.content


class CallRecord(BaseModel):
    """One call of an episode, as the verifiers count them (``error`` set when it was rejected)."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class EpisodeSession(Protocol):
    """One episode's live environment (its own state or sandbox), closed when the episode ends."""

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome: ...

    async def verdict(self, calls: list[CallRecord]) -> VerifierResult:
        """The family's verdict on the final state, with protocol compliance and the step budget."""
        ...

    async def close(self) -> None: ...


class EpisodeEnvironment(Protocol):
    """A family's tools and environment for post-training episodes."""

    family: str

    def messages(self, instance: TaskInstance) -> list[dict[str, str]]:
        """The policy-visible opening: the family's system prompt and the instance's request."""
        ...

    def tools(self) -> list[ToolSpec]:
        """The tool definitions offered, as the eval offers them."""
        ...

    def reference_turns(self, instance: TaskInstance) -> list[list[CallRecord]]:
        """The generator's reference solution as assistant turns of tool calls (for SFT demonstrations)."""
        ...

    async def open(self, instance: TaskInstance, config: EpisodeConfig) -> EpisodeSession: ...


_ENVIRONMENTS: dict[str, EpisodeEnvironment] = {}


def episode_environment(cls: Callable[[], EpisodeEnvironment]) -> Callable[[], EpisodeEnvironment]:
    """Class decorator: register a family's episode environment."""
    instance = cls()
    _ENVIRONMENTS[instance.family] = instance
    return cls


def episode_families() -> list[str]:
    """Families with a registered episode environment."""
    return sorted(_ENVIRONMENTS)


def environment_for(family: str) -> EpisodeEnvironment:
    """The episode environment of ``family``; raises :class:`UnsupportedFamily` naming the ones there are."""
    if family not in _ENVIRONMENTS:
        raise UnsupportedFamily(
            f"family {family!r} has no episode environment (families with one: {', '.join(episode_families())})"
        )
    return _ENVIRONMENTS[family]


def opening_messages(family: str, instance: TaskInstance) -> list[dict[str, str]]:
    """The family's system prompt (as its eval sets it) and the instance's request."""
    from evalsuite.registry import get_family

    system = get_family(family).system_prompt
    prompt = {"role": "user", "content": instance.prompt}
    return [{"role": "system", "content": system}, prompt] if system else [prompt]


def budget_and_protocol(calls: list[CallRecord], max_steps: int) -> dict[str, float]:
    """The agent scorer's protocol and budget components: protocol loses 0.25 per rejected call, the budget
    holds when the calls are at most ``max_steps`` (``evalsuite.families.agent.verifier.verify_agent``)."""
    rejected = sum(1 for call in calls if call.error is not None)
    return {"protocol": max(0.0, 1.0 - 0.25 * rejected), "budget": float(len(calls) <= max_steps)}


def shaped_score(goal: float, protocol: float, budget: float) -> float:
    """The seed's episode reward shape, the agent scorer's weights (goal 0.7, protocol 0.15, budget 0.15),
    clipped to [0, 1]."""
    from evalsuite.families.agent.verifier import AGENT_WEIGHTS

    raw = (
        AGENT_WEIGHTS["goal"] * goal + AGENT_WEIGHTS["protocol"] * protocol + AGENT_WEIGHTS["budget"] * budget
    )
    return round(min(1.0, max(0.0, raw)), 6)
