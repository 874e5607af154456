"""Agent: multi-step support requests carried out with the simulated shop's tools."""

from __future__ import annotations

from typing import Any

from evalsuite.errors import EvalError
from evalsuite.families.agent.generator import BUILDERS
from evalsuite.families.agent.prompt import POLICY
from evalsuite.families.agent.verifier import AgentTrace, replay_agent, verify_agent
from evalsuite.registry import eval_family
from evalsuite.schema import TaskInstance, VerifierResult


@eval_family("agent", builders=BUILDERS, task="evalsuite.families.agent.task:agent", system_prompt=POLICY)
def verify(instance: TaskInstance, output: Any) -> VerifierResult:
    """Takes an :class:`AgentTrace`, or a list of tool calls that is replayed on a fresh shop first."""
    if isinstance(output, list):
        output = replay_agent(instance, output)
    if not isinstance(output, AgentTrace):
        raise EvalError("agent verification takes an AgentTrace or a list of tool calls")
    return verify_agent(instance, output)
