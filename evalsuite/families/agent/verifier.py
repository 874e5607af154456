"""Agent verifier: the shop's final state against the goal, protocol kept, step budget respected."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from evalsuite.families.agent.shop import FORBIDDEN_TOOLS, LOOKUP_TOOLS, Shop, ShopRejected, ShopState
from evalsuite.schema import TaskInstance, VerifierResult

AGENT_WEIGHTS: dict[str, float] = {"goal": 0.7, "protocol": 0.15, "budget": 0.15}


class ToolCallRecord(BaseModel):
    """One tool call the model made; ``error`` is set when the environment rejected it."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class AgentTrace(BaseModel):
    """What an agent episode left behind: the shop's final state and the calls, in order."""

    final_state: dict[str, Any]
    calls: list[ToolCallRecord] = Field(default_factory=list)


def replay_agent(instance: TaskInstance, calls: list[ToolCallRecord] | list[dict[str, Any]]) -> AgentTrace:
    """Execute ``calls`` on a fresh shop built from the instance; rejected calls get their error recorded."""
    shop = Shop(ShopState.model_validate(instance.expected["initial_state"]))
    records: list[ToolCallRecord] = []
    for call in calls:
        record = call if isinstance(call, ToolCallRecord) else ToolCallRecord.model_validate(call)
        error = None
        try:
            shop.call(record.name, record.arguments)
        except ShopRejected as exc:
            error = str(exc)
        records.append(record.model_copy(update={"error": error}))
    return AgentTrace(final_state=shop.state.model_dump(), calls=records)


def verify_agent(instance: TaskInstance, trace: AgentTrace) -> VerifierResult:
    """Goal state reached (whole shop state equal), protocol kept, steps within budget.

    ``score = 0.7 goal + 0.15 protocol + 0.15 budget``, forced to 0 when a forbidden tool was called;
    protocol loses 0.25 per rejected call. ``correct`` needs the goal, no violation and the budget kept.
    When the request needs no change (the goal is the initial state, e.g. "cancel it if still pending" for
    a shipped order), the goal counts only if the model looked something up successfully: otherwise an
    episode that never called a tool would earn full credit on every such instance.
    """
    goal = ShopState.model_validate(instance.expected["goal_state"])
    reached = ShopState.model_validate(trace.final_state) == goal
    no_change = goal == ShopState.model_validate(instance.expected["initial_state"])
    looked_up = any(c.name in LOOKUP_TOOLS and c.error is None for c in trace.calls)
    unchecked = reached and no_change and not looked_up
    reached = reached and not unchecked
    forbidden = [c.name for c in trace.calls if c.name in FORBIDDEN_TOOLS]
    invalid = sum(1 for c in trace.calls if c.error is not None)
    protocol = 0.0 if forbidden else max(0.0, 1.0 - 0.25 * invalid)
    within = len(trace.calls) <= instance.max_steps
    components = {"goal": float(reached), "protocol": protocol, "budget": float(within)}
    score = 0.0 if forbidden else sum(AGENT_WEIGHTS[k] * v for k, v in components.items())
    explanation = (
        f"goal {'reached' if reached else 'not reached'}"
        f"{' (nothing to change, but nothing was looked up)' if unchecked else ''}; {len(trace.calls)} calls (budget {instance.max_steps}); "
        f"{invalid} rejected; forbidden: {', '.join(forbidden) or 'none'}"
    )
    correct = reached and not forbidden and within
    return VerifierResult(
        score=round(score, 6), correct=correct, components=components, explanation=explanation
    )
