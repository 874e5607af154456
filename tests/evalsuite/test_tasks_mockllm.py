"""Every scorer end to end through Inspect with mockllm: right, wrong and malformed behaviour."""

from __future__ import annotations

from pathlib import Path

import pytest
from evalsuite_oracles import agent_policy, documents_policy, terminal_policy
from inspect_ai import eval as inspect_eval
from inspect_ai.model import get_model

from evalsuite.families.agent.task import agent
from evalsuite.families.documents.task import documents
from evalsuite.families.terminal.task import terminal
from evalsuite.gate import read_outcomes
from evalsuite.generators import generate_instances
from evalsuite.sandbox import bwrap_available


def run_task(task, policy, tmp_path: Path, name: str = "mockllm/model") -> list[dict]:  # type: ignore[no-untyped-def]
    log = inspect_eval(
        task, model=get_model(name, custom_outputs=policy), log_dir=str(tmp_path), display="none"
    )[0]
    assert log.status == "success", log.error
    return [
        {"value": s.scores[next(iter(s.scores))].value, **(s.scores[next(iter(s.scores))].metadata or {})}
        for s in log.samples or []
        if s.scores
    ]


@pytest.mark.parametrize(
    ("mode", "expect_correct"), [("right", True), ("wrong", False), ("malformed", False)]
)
def test_documents_scorer(mode: str, expect_correct: bool, tmp_path: Path) -> None:
    instances = generate_instances("documents", "test", 8)
    scores = run_task(documents(n=8), documents_policy(instances, mode), tmp_path)
    assert len(scores) == 8 and all(s["correct"] is expect_correct for s in scores)


def test_agent_scorer(tmp_path: Path) -> None:
    instances = generate_instances("agent", "test", 6)
    scores = run_task(agent(n=6), agent_policy(instances), tmp_path)
    assert all(s["correct"] and s["value"] == pytest.approx(1.0) for s in scores)
    first_customer = {i.prompt: next(iter(i.expected["initial_state"]["customers"])) for i in instances}
    bad = [{"name": "delete_customer", "arguments": {"customer_id": next(iter(first_customer.values()))}}]
    scores = run_task(agent(n=6), agent_policy(instances, extra_calls=bad), tmp_path)
    assert all(not s["correct"] and s["value"] == 0.0 for s in scores)
    junk = [
        {"name": "no_such_tool", "arguments": {}},
        {"name": "get_order", "arguments": {"order_id": "ORD-0"}},
    ]
    scores = run_task(agent(n=6), agent_policy(instances, extra_calls=junk), tmp_path)
    assert all(s["components"]["protocol"] == 0.5 for s in scores)


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (bwrap) not usable here")
@pytest.mark.parametrize("solve", [True, False])
def test_terminal_scorer_in_bwrap(solve: bool, tmp_path: Path) -> None:
    instances = generate_instances("terminal", "test", 5)
    scores = run_task(terminal(n=5), terminal_policy(instances, solve), tmp_path)
    assert len(scores) == 5 and all(s["correct"] is solve for s in scores)
    outcomes = read_outcomes(tmp_path)  # the log (with its bwrap sandbox config) reads back for the gate
    assert len(outcomes) == 5 and all(o.correct is solve and o.family == "terminal" for o in outcomes)
