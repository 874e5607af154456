"""The agent family's Inspect task: support requests carried out through the simulated shop's tools."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from inspect_ai import Task, task
from inspect_ai.model import ChatMessageAssistant, ChatMessageTool
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver, system_message
from inspect_ai.tool import Tool, ToolDef, ToolError
from inspect_ai.util import store

from evalsuite.families.agent.prompt import POLICY
from evalsuite.families.agent.shop import Shop, ShopRejected, ShopState
from evalsuite.families.agent.verifier import AgentTrace, ToolCallRecord, verify_agent
from evalsuite.generators import DEFAULT_ROTATION_KEY
from evalsuite.inspect_task import correct_rate, family_dataset, instance_of, to_score, tool_turns
from evalsuite.schema import Difficulty, Split

SHOP_STATE_KEY = "evalsuite_shop_state"


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
        return to_score(verify_agent(instance_of(state), agent_trace(state)))

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
        dataset=family_dataset("agent", split, n, seed, difficulty, rotation_key),
        solver=[system_message(POLICY), open_shop(), tool_turns()],
        scorer=agent_scorer(),
    )
