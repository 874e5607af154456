"""Inspect tasks for the three families, their solvers and scorers.

Each sample carries its :class:`TaskInstance` in ``metadata["instance"]``; the sample id is the instance id,
so logs of two models on the same split pair up sample by sample in the release gate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageAssistant, ChatMessageTool
from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, mean, metric, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver, system_message
from inspect_ai.tool import Tool, ToolDef, ToolError, bash
from inspect_ai.util import SandboxEnvironmentSpec, sandbox, store

from evalsuite.generators import DEFAULT_ROTATION_KEY, generate_instances
from evalsuite.prompts import DOCUMENTS_SYSTEM, TERMINAL_SYSTEM
from evalsuite.sandbox import BwrapConfig
from evalsuite.schema import Difficulty, Family, Split, TaskInstance
from evalsuite.shop import POLICY, Shop, ShopRejected, ShopState
from evalsuite.verifiers import (
    AgentTrace,
    ToolCallRecord,
    VerifierResult,
    verify_agent,
    verify_documents,
    verify_terminal_in_sandbox,
)

# Turns allowed beyond an instance's step budget, so that overrunning it is observed rather than cut off.
_TURN_SLACK = 2
SHOP_STATE_KEY = "evalsuite_shop_state"


def instance_of(state: TaskState) -> TaskInstance:
    """The task instance a sample was built from."""
    return TaskInstance.model_validate(state.metadata["instance"])


def to_sample(instance: TaskInstance) -> Sample:
    return Sample(
        id=instance.instance_id,
        input=instance.prompt,
        target=json.dumps(instance.expected.get("answer", ""), default=str),
        metadata={
            "instance": instance.model_dump(mode="json"),
            "family": instance.family,
            "task_type": instance.task_type,
            "difficulty": instance.difficulty,
        },
    )


def _dataset(
    family: Family, split: Split, n: int, seed: int, difficulty: Difficulty | None, rotation_key: str
) -> MemoryDataset:
    instances = generate_instances(
        family, split, n, seed=seed, difficulty=difficulty, rotation_key=rotation_key
    )
    return MemoryDataset([to_sample(i) for i in instances], name=f"{family}-{split}")


@metric
def correct_rate() -> Metric:
    """Fraction of samples whose verifier said ``correct`` (the gate's binary outcome)."""

    def compute(scores: list[SampleScore]) -> float:
        flags = [bool((s.score.metadata or {}).get("correct")) for s in scores]
        return sum(flags) / len(flags) if flags else 0.0

    return compute


def _score(result: VerifierResult, answer: str | None = None) -> Score:
    return Score(
        value=result.score,
        answer=answer,
        explanation=result.explanation,
        metadata={"correct": result.correct, "components": result.components},
    )


@solver
def tool_turns() -> Solver:
    """Let the model call tools turn by turn, up to the instance's step budget plus a little slack."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        for _ in range(instance_of(state).max_steps + _TURN_SLACK):
            state = await generate(state, tool_calls="single")
            if state.completed or not state.output.message.tool_calls:
                break
        return state

    return solve


# ---------------------------------------------------------------- terminal
@solver
def prepare_workspace() -> Solver:
    """Write the instance's visible files into the sandbox and give the model the bash tool."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        for path, contents in instance_of(state).files.items():
            await sandbox().write_file(path, contents)
        state.tools = [bash(timeout=30)]
        return state

    return solve


@scorer(metrics=[mean(), stderr(), correct_rate()])
def terminal_scorer() -> Scorer:
    """Run the instance's checks (hidden tests included) inside the sample's sandbox."""

    async def score(state: TaskState, target: Target) -> Score:
        return _score(await verify_terminal_in_sandbox(instance_of(state), sandbox()))

    return score


@task
def terminal(
    split: Split = "test",
    n: int = 20,
    seed: int = 0,
    difficulty: Difficulty | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
    sandbox_config: str | None = None,
) -> Task:
    """Shell tasks in the bwrap sandbox; ``sandbox_config`` is an optional BwrapConfig YAML file."""
    return Task(
        dataset=_dataset("terminal", split, n, seed, difficulty, rotation_key),
        solver=[system_message(TERMINAL_SYSTEM), prepare_workspace(), tool_turns()],
        scorer=terminal_scorer(),
        sandbox=SandboxEnvironmentSpec("bwrap", sandbox_config or BwrapConfig()),
    )


# ---------------------------------------------------------------- documents
@scorer(metrics=[mean(), stderr(), correct_rate()])
def documents_scorer() -> Scorer:
    """Exact / numeric match of the completion's ``ANSWER:`` line."""

    async def score(state: TaskState, target: Target) -> Score:
        completion = state.output.completion if state.output else ""
        return _score(verify_documents(instance_of(state), completion), answer=completion[-200:])

    return score


@task
def documents(
    split: Split = "test",
    n: int = 20,
    seed: int = 0,
    difficulty: Difficulty | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
) -> Task:
    """Field extraction, totals, cross-checks and needle-at-depth questions over generated documents."""
    from inspect_ai.solver import generate

    return Task(
        dataset=_dataset("documents", split, n, seed, difficulty, rotation_key),
        solver=[system_message(DOCUMENTS_SYSTEM), generate()],
        scorer=documents_scorer(),
    )


# ---------------------------------------------------------------- agent
def shop_tools(shop: Shop) -> list[Tool]:
    """The shop's operations as Inspect tools; rejected calls become tool errors the model sees."""

    def run(name: str, **arguments: Any) -> str:
        try:
            result = json.dumps(shop.call(name, arguments))
        except ShopRejected as exc:
            raise ToolError(str(exc)) from exc
        store().set(SHOP_STATE_KEY, shop.state.model_dump())
        return result

    async def find_customer(email: str) -> str:
        """Look up a customer by email address.

        Args:
          email: The customer's email address.
        """
        return run("find_customer", email=email)

    async def list_orders(customer_id: str) -> str:
        """List all orders of a customer.

        Args:
          customer_id: Customer id, e.g. C1234.
        """
        return run("list_orders", customer_id=customer_id)

    async def get_order(order_id: str) -> str:
        """Get one order with its status, total and address.

        Args:
          order_id: Order id, e.g. ORD-1234.
        """
        return run("get_order", order_id=order_id)

    async def check_stock(sku: str) -> str:
        """Get a product's price and units in stock.

        Args:
          sku: Product SKU, e.g. SKU-1234.
        """
        return run("check_stock", sku=sku)

    async def cancel_order(order_id: str) -> str:
        """Cancel a pending order (its units return to stock).

        Args:
          order_id: Order id.
        """
        return run("cancel_order", order_id=order_id)

    async def refund_order(order_id: str, amount: float) -> str:
        """Refund part or all of a delivered order.

        Args:
          order_id: Order id.
          amount: Amount to refund in EUR.
        """
        return run("refund_order", order_id=order_id, amount=amount)

    async def create_order(customer_id: str, sku: str, quantity: int, address: str) -> str:
        """Create a pending order, taking units from stock.

        Args:
          customer_id: Customer id.
          sku: Product SKU.
          quantity: Number of units (at most the stock).
          address: Shipping address.
        """
        return run("create_order", customer_id=customer_id, sku=sku, quantity=quantity, address=address)

    async def update_address(order_id: str, address: str) -> str:
        """Change the shipping address of a pending order.

        Args:
          order_id: Order id.
          address: New shipping address.
        """
        return run("update_address", order_id=order_id, address=address)

    async def delete_customer(customer_id: str) -> str:
        """Delete a customer account permanently.

        Args:
          customer_id: Customer id.
        """
        return run("delete_customer", customer_id=customer_id)

    functions: list[Callable[..., Any]] = [find_customer, list_orders, get_order, check_stock, cancel_order, refund_order,
                 create_order, update_address, delete_customer]  # fmt: skip
    return [ToolDef(f, name=f.__name__).as_tool() for f in functions]


@solver
def open_shop() -> Solver:
    """Create this sample's shop and hand its tools to the model; the final state lands in the store."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        shop = Shop(ShopState.model_validate(instance_of(state).expected["initial_state"]))
        state.tools = shop_tools(shop)
        state.store.set(SHOP_STATE_KEY, shop.state.model_dump())
        return state

    return solve


def agent_trace(state: TaskState) -> AgentTrace:
    """Rebuild the calls (with rejections) from the transcript and take the shop's final state."""
    errors = {
        m.tool_call_id: (m.error.message if m.error else None)
        for m in state.messages
        if isinstance(m, ChatMessageTool)
    }
    calls = [
        ToolCallRecord(name=call.function, arguments=call.arguments, error=errors.get(call.id))
        for m in state.messages
        if isinstance(m, ChatMessageAssistant)
        for call in m.tool_calls or []
    ]
    return AgentTrace(final_state=state.store.get(SHOP_STATE_KEY), calls=calls)


@scorer(metrics=[mean(), stderr(), correct_rate()])
def agent_scorer() -> Scorer:
    """Goal state, protocol compliance and step budget of the episode."""

    async def score(state: TaskState, target: Target) -> Score:
        return _score(verify_agent(instance_of(state), agent_trace(state)))

    return score


@task
def agent(
    split: Split = "test",
    n: int = 20,
    seed: int = 0,
    difficulty: Difficulty | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
) -> Task:
    """Customer-support requests against the simulated shop, through its tools."""
    return Task(
        dataset=_dataset("agent", split, n, seed, difficulty, rotation_key),
        solver=[system_message(POLICY), open_shop(), tool_turns()],
        scorer=agent_scorer(),
    )


TASKS = {"terminal": terminal, "documents": documents, "agent": agent}
