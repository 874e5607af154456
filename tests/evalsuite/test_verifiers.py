from __future__ import annotations

import pytest

from evalsuite.errors import EvalError
from evalsuite.families.agent.verifier import AgentTrace, replay_agent
from evalsuite.families.documents.verifier import UNFORMATTED_ANSWER_SCORE, parse_answer, parse_number
from evalsuite.families.terminal.verifier import CheckOutcome, TerminalObservation
from evalsuite.generators import generate_instance, generate_instances
from evalsuite.verifiers import verify


def test_parsing() -> None:
    assert parse_answer("blah\nANSWER: 1,234.50 EUR") == "1,234.50 EUR"
    assert parse_answer("ANSWER: 1\nanswer: **2**") == "2"
    assert parse_answer("no marker here") is None
    assert parse_number("EUR 1,234.50") == 1234.5
    assert parse_number("\u221212") == -12.0
    assert parse_number("n/a") is None
    assert parse_number("-$5.25") == -5.25


@pytest.mark.parametrize("task_type", ["extract_field", "compute_total", "cross_check", "needle"])
def test_documents_right_wrong_malformed(task_type: str) -> None:
    instance = generate_instance("documents", task_type, "medium", 21)
    expected = instance.expected["answer"]
    right = verify(instance, f"Reasoning...\nANSWER: {expected}")
    assert right.correct and right.score == 1.0
    if instance.expected["match"] == "numeric":
        assert verify(instance, f"ANSWER: EUR {float(expected):,.2f}").correct
        wrong = verify(instance, f"ANSWER: {float(expected) + 1}")
    else:
        assert verify(instance, f"ANSWER: '{str(expected).upper()}'.").correct
        wrong = verify(instance, "ANSWER: something else")
    assert not wrong.correct and wrong.score == 0.0 and wrong.components["format"] == 1.0
    lenient = verify(instance, f"Let me look.\nIt is {expected}.")
    assert (
        lenient.correct and lenient.score == UNFORMATTED_ANSWER_SCORE and lenient.components["format"] == 0.0
    )
    for malformed_text in ("", "I am not sure, sorry.", "ANSWER:", "x" * 400):
        malformed = verify(instance, malformed_text)
        assert not malformed.correct and malformed.score == 0.0 and malformed.components["format"] == 0.0
    with pytest.raises(EvalError):
        verify(instance, AgentTrace(final_state={}))


def test_agent_reference_forbidden_invalid_and_budget() -> None:
    instances = [i for i in generate_instances("agent", "dev", 12) if i.expected["reference_calls"]]
    instance = instances[0]
    reference = instance.expected["reference_calls"]
    right = verify(instance, reference)
    assert right.correct and right.score == pytest.approx(1.0)
    nothing = verify(instance, [])
    assert not nothing.correct and nothing.components["goal"] == 0.0
    customer = next(iter(instance.expected["initial_state"]["customers"]))
    forbidden = verify(
        instance, [{"name": "delete_customer", "arguments": {"customer_id": customer}}, *reference]
    )
    assert forbidden.score == 0.0 and not forbidden.correct
    invalid = verify(instance, [{"name": "get_order", "arguments": {"order_id": "ORD-0"}}, *reference])
    assert invalid.correct and invalid.components["protocol"] == 0.75 and invalid.score < 1.0
    lookups = [{"name": "check_stock", "arguments": {"sku": "SKU-nope"}}] * 0 + [
        {"name": "list_orders", "arguments": {"customer_id": customer}}
    ] * (instance.max_steps + 1)
    over = verify(instance, [*lookups, *reference])
    assert not over.correct and over.components["budget"] == 0.0 and over.components["goal"] == 1.0
    trace = replay_agent(instance, reference)
    assert verify(instance, trace).correct


def test_agent_side_effects_break_the_goal() -> None:
    instance = next(i for i in generate_instances("agent", "dev", 12) if i.task_type == "cancel_order")
    state = instance.expected["initial_state"]
    pending = [o for o, v in state["orders"].items() if v["status"] == "pending"]
    reference = instance.expected["reference_calls"]
    extra = [o for o in pending if {"name": "cancel_order", "arguments": {"order_id": o}} not in reference]
    if extra:
        result = verify(instance, [*reference, {"name": "cancel_order", "arguments": {"order_id": extra[0]}}])
        assert not result.correct and result.components["goal"] == 0.0


def test_terminal_observations() -> None:
    instance = generate_instance("terminal", "rename_files", "easy", 2)
    passing = TerminalObservation(
        checks={c.name: CheckOutcome(exit_code=0, stdout=c.expected_stdout or "") for c in instance.checks}
    )
    assert verify(instance, passing).correct
    partial = passing.model_copy(update={"checks": {**passing.checks, "content": CheckOutcome(exit_code=1)}})
    result = verify(instance, partial)
    assert not result.correct and result.score == pytest.approx(2 / 3)
    assert verify(instance, TerminalObservation()).score == 0.0
    with pytest.raises(EvalError):
        verify(instance, "ANSWER: 3")


def test_verifiers_import_light() -> None:
    import subprocess
    import sys

    # Discovering every registered family (what verify() does on first use) must stay as light.
    code = (
        "import sys, evalsuite.verifiers, evalsuite.registry; evalsuite.registry.family_names(); "
        "print('inspect_ai' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_agent_no_change_request_needs_a_lookup() -> None:
    """'Cancel it if still pending' on a shipped order: doing nothing blindly earns no goal credit."""
    instance = next(
        i
        for i in generate_instances("agent", "dev", 60)
        if i.expected["goal_state"] == i.expected["initial_state"]
    )
    blind = verify(instance, [])
    assert not blind.correct and blind.components["goal"] == 0.0
    assert "nothing was looked up" in blind.explanation
    order_id = next(iter(instance.expected["initial_state"]["orders"]))
    failed_lookup = verify(instance, [{"name": "get_order", "arguments": {"order_id": "ORD-0"}}])
    assert not failed_lookup.correct
    checked = verify(instance, [{"name": "get_order", "arguments": {"order_id": order_id}}])
    assert checked.correct and checked.components["goal"] == 1.0
