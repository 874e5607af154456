"""From real ``traffic``-family Inspect logs (mockllm candidate and baseline) to a review session, the gate's
human-preference file and DPO preference pairs: the glue between the traffic family and the review tool."""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evalsuite.human_preference import load_human_preference
from feedback.review.cli import review_app
from feedback.review.store import open_review_store
from infra.manifest import Lineage
from infra.registry import open_registry
from posttrain.dpo import review_pairs

pytestmark = pytest.mark.slow

SET_REF = "traffic-support@2026-w49"


def publish_set(registry_url: str) -> None:
    """An eval set of four test items: two need review, one has a JSON signal, one a dev item (not replayed)."""
    from evalsuite.families.traffic import EVALSET_KIND, ITEMS_FILE, EvalSetItem

    def item(i: int, split: str = "test", signal: str | None = None) -> EvalSetItem:
        return EvalSetItem(id=f"item{i}", split=split, period="2026-w49", signal=signal,  # type: ignore[arg-type]
                           messages=[{"role": "user", "content": f"How do I reset my password? ({i})"}])  # fmt: skip

    items = [item(0), item(1), item(2, signal="json"), item(3, split="dev")]
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / ITEMS_FILE).write_text("".join(i.model_dump_json() + "\n" for i in items))
        open_registry(registry_url).publish(Path(directory), "traffic-support", "2026-w49", kind=EVALSET_KIND,
                                            lineage=Lineage(produced_by="test"))  # fmt: skip


def run_traffic(registry_url: str, name: str, answer: str, log_dir: Path) -> Path:
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    from evalsuite.families.traffic.task import traffic

    def output() -> ModelOutput:
        made = ModelOutput.from_content(model=f"mockllm/{name}", content=answer)
        # With usage set, mockllm does not count tokens with tiktoken (which downloads its encoding).
        made.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return made

    model = get_model(f"mockllm/{name}", custom_outputs=(output() for _ in itertools.count()))
    (result,) = inspect_eval(traffic(set=SET_REF, split="test", registry=registry_url), model=model,
                             log_dir=str(log_dir), display="none")  # fmt: skip
    assert result.status == "success"
    return log_dir


def test_review_session_from_traffic_logs_to_gate_file_and_dpo_pairs(tmp_path: Path) -> None:
    registry = f"file://{tmp_path / 'registry'}"
    publish_set(registry)
    candidate = run_traffic(
        registry, "tandem-candidate", "Open Settings > Security > Reset.", tmp_path / "cand"
    )
    baseline = run_traffic(registry, "tandem-standard", "Please contact support.", tmp_path / "base")
    database = str(tmp_path / "gateway.db")
    runner = CliRunner()
    created = runner.invoke(review_app, ["create", "--set", SET_REF, "--candidate-logs", str(candidate),
                                         "--baseline-logs", str(baseline), "--session", "support-w49",
                                         "--reviews-per-pair", "2", "--database", database])  # fmt: skip
    assert created.exit_code == 0, created.output
    store = open_review_store(database)
    try:
        session = store.session("support-w49")
        models = (session.candidate_model, session.baseline_model)
        assert models == ("mockllm/tandem-candidate", "mockllm/tandem-standard")
        pairs = store.pairs("support-w49")
        # The JSON item was scored automatically and the dev item not replayed: two pairs.
        assert sorted(p.item_id for p in pairs) == ["item0", "item1"]
        for pair in pairs:
            assert pair.prompt[0].role == "user" and "reset my password" in pair.prompt[0].content
            assert pair.answer_of("candidate").text == "Open Settings > Security > Reset."
            assert pair.answer_of("baseline").text == "Please contact support."
            for reviewer in ("r1", "r2"):
                store.vote(pair.pair_id, reviewer, pair.candidate_slot)
    finally:
        store.close()

    human = tmp_path / "human.json"
    exported = runner.invoke(review_app, ["export", "--session", "support-w49", "--out", str(human), "--pairs",
                                          "--registry", registry, "--version", "v1", "--database", database])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    summary = load_human_preference(human)
    assert (summary.n_pairs, summary.wins, summary.win_rate, summary.set_ref) == (2, 4, 1.0, SET_REF)
    # Reviewers agree on every pair: kappa 1, or undefined when every blind vote fell in one category.
    slots = {p["candidate_slot"] for p in json.loads(human.read_text())["pairs"]}
    assert summary.fleiss_kappa == (1.0 if len(slots) == 2 else None)
    manifest = open_registry(registry).manifest("reviews-support-w49@v1")
    assert manifest.lineage.parents == [SET_REF]
    _, preferences = review_pairs(open_registry(registry), "reviews:support-w49")
    assert {p.chosen[0].content for p in preferences} == {"Open Settings > Security > Reset."}
