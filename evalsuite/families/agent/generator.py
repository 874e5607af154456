"""Agent tasks: multi-step support requests against the simulated shop (:mod:`evalsuite.families.agent.shop`).

Each builder makes an initial shop state and a request, then derives the goal state by running a
reference solution on a copy of the shop; the verifier compares the model's final state to it. The
reference solution looks up what the request depends on before acting, as the model has to: about a third
of the requests need no change at all ("cancel it if still pending" for a shipped order), and the verifier
credits those only after a lookup.
"""

from __future__ import annotations

import random
from typing import Any

from evalsuite.families.agent.shop import Customer, Order, Product, Shop, ShopState
from evalsuite.generators.base import CITIES, WORDS, Builder, Draft, person
from evalsuite.schema import Difficulty


def _shop(rng: random.Random, difficulty: Difficulty) -> ShopState:
    n_customers = {"easy": 2, "medium": 4, "hard": 6}[difficulty]
    products = {}
    for i in range(4 + n_customers):
        sku = f"SKU-{rng.randrange(100, 999)}{i}"
        products[sku] = Product(
            sku=sku,
            name=f"{rng.choice(WORDS).title()} {rng.choice(('lamp', 'chair', 'kettle', 'desk', 'mug'))}",
            price=rng.randrange(500, 20000) / 100,
            stock=rng.randrange(0, 25),
        )
    customers, orders = {}, {}
    number = rng.randrange(1000, 4000)
    for c in range(n_customers):
        name = person(rng)
        cid = f"C{rng.randrange(100, 999)}{c}"
        customers[cid] = Customer(
            customer_id=cid, name=name, email=f"{name.replace(' ', '.').lower()}{c}@mail.example"
        )
        for _ in range(rng.randrange(2, 4)):
            sku = rng.choice(sorted(products))
            quantity = rng.randrange(1, 4)
            oid = f"ORD-{number}"
            number += 1
            orders[oid] = Order(
                order_id=oid,
                customer_id=cid,
                sku=sku,
                quantity=quantity,
                total=round(products[sku].price * quantity, 2),
                status=rng.choice(("pending", "shipped", "delivered")),
                address=f"{rng.randrange(1, 99)} {rng.choice(WORDS).title()} Road, {rng.choice(CITIES)}",
            )
    return ShopState(customers=customers, orders=orders, products=products, next_order_number=number + 100)


def _draft(task_type: str, request: str, state: ShopState, shop: Shop, max_steps: int, **meta: Any) -> Draft:
    return Draft(
        task_type=task_type,
        prompt=request,
        expected={
            "initial_state": state.model_dump(),
            "goal_state": shop.state.model_dump(),
            "reference_calls": shop.journal,
        },
        max_steps=max_steps,
        metadata=meta,
    )


def _look_up_orders(shop: Shop, customer: Customer) -> None:
    """The reads a request by email needs: who the customer is, then their orders."""
    shop.call("find_customer", {"email": customer.email})
    shop.call("list_orders", {"customer_id": customer.customer_id})


def cancel_order(rng: random.Random, difficulty: Difficulty) -> Draft:
    state = _shop(rng, difficulty)
    shop = Shop(state)
    customer = rng.choice(sorted(state.customers.values(), key=lambda c: c.customer_id))
    mine = sorted(
        (o for o in state.orders.values() if o.customer_id == customer.customer_id), key=lambda o: o.order_id
    )
    target = rng.choice(mine)
    if difficulty == "easy":
        request = (
            f"Please cancel order {target.order_id} if it is still pending; otherwise leave it as it is."
        )
        shop.call("get_order", {"order_id": target.order_id})
        if target.status == "pending":
            shop.call("cancel_order", {"order_id": target.order_id})
        steps = 4
    else:
        request = (
            f"The customer with email {customer.email} wants every one of their orders that has not shipped "
            "yet cancelled."
        )
        if difficulty == "hard":
            request += " For each of their orders already delivered, refund 10% of the order total (rounded to cents)."
        _look_up_orders(shop, customer)
        for order in mine:
            if order.status == "pending":
                shop.call("cancel_order", {"order_id": order.order_id})
            elif order.status == "delivered" and difficulty == "hard":
                shop.call(
                    "refund_order", {"order_id": order.order_id, "amount": round(order.total * 0.10, 2)}
                )
        steps = 8 if difficulty == "medium" else 12
    return _draft("cancel_order", request, state, shop, steps)


def place_order(rng: random.Random, difficulty: Difficulty) -> Draft:
    state = _shop(rng, difficulty)
    shop = Shop(state)
    customer = rng.choice(sorted(state.customers.values(), key=lambda c: c.customer_id))
    product = rng.choice(sorted(state.products.values(), key=lambda p: p.sku))
    wanted = rng.randrange(1, 30)
    address = f"{rng.randrange(1, 99)} {rng.choice(WORDS).title()} Lane, {rng.choice(CITIES)}"
    who = customer.customer_id if difficulty == "easy" else f"the customer with email {customer.email}"
    request = (
        f"Place an order for {who}: {wanted} units of product {product.sku}, shipped to '{address}'. If fewer "
        "units are in stock, order all the units that are in stock instead; if none are in stock, do not order."
    )
    if difficulty == "hard":
        request += " Also change the shipping address of all their other pending orders to that same address."
    if difficulty != "easy":
        shop.call("find_customer", {"email": customer.email})
    shop.call("check_stock", {"sku": product.sku})
    quantity = min(wanted, product.stock)
    if quantity > 0:
        shop.call(
            "create_order",
            {
                "customer_id": customer.customer_id,
                "sku": product.sku,
                "quantity": quantity,
                "address": address,
            },
        )
    if difficulty == "hard":
        shop.call("list_orders", {"customer_id": customer.customer_id})
        for order in sorted(state.orders.values(), key=lambda o: o.order_id):
            if order.customer_id == customer.customer_id and order.status == "pending":
                shop.call("update_address", {"order_id": order.order_id, "address": address})
    return _draft("place_order", request, state, shop, {"easy": 4, "medium": 6, "hard": 12}[difficulty])


def fix_address(rng: random.Random, difficulty: Difficulty) -> Draft:
    state = _shop(rng, difficulty)
    shop = Shop(state)
    customer = rng.choice(sorted(state.customers.values(), key=lambda c: c.customer_id))
    address = f"{rng.randrange(1, 99)} {rng.choice(WORDS).title()} Street, {rng.choice(CITIES)}"
    mine = sorted(
        (o for o in state.orders.values() if o.customer_id == customer.customer_id), key=lambda o: o.order_id
    )
    if difficulty == "easy":
        target = rng.choice(mine)
        request = (
            f"Change the shipping address of order {target.order_id} to '{address}' if it is still pending; "
            "if not, leave it unchanged."
        )
        shop.call("get_order", {"order_id": target.order_id})
        if target.status == "pending":
            shop.call("update_address", {"order_id": target.order_id, "address": address})
    else:
        request = (
            f"{customer.name} (email {customer.email}) has moved to '{address}'. Update every pending order of "
            "theirs to the new address."
        )
        if difficulty == "hard":
            request += (
                " Then, if any of their orders has already shipped, cancel nothing but note it in your reply."
            )
        _look_up_orders(shop, customer)
        for order in mine:
            if order.status == "pending":
                shop.call("update_address", {"order_id": order.order_id, "address": address})
    return _draft("fix_address", request, state, shop, {"easy": 4, "medium": 8, "hard": 10}[difficulty])


BUILDERS: dict[str, Builder] = {
    "cancel_order": cancel_order,
    "place_order": place_order,
    "fix_address": fix_address,
}
