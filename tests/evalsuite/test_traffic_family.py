"""The ``traffic`` replay family end to end through Inspect with mockllm: a published eval set is replayed
(messages, tools, JSON schema), JSON and tool-call answers are scored, the rest are left for review, and the
answers read back from the logs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import list_eval_logs, read_eval_log
from inspect_ai.model import ChatMessage, ChatMessageUser, ModelOutput, ModelUsage, get_model

from evalsuite.errors import EvalError, GeneratorError
from evalsuite.families.traffic import EvalSetItem, read_answers, verify_json, verify_tool_calls
from evalsuite.gate import read_outcomes
from evalsuite.registry import family_names, replay_family_names
from evalsuite.runner import build_tasks, run_eval
from infra.errors import ArtifactNotFound
from infra.registry import open_registry

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order by id",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}

# prompt -> (signal, response_format, tools, the mock model's answer: text or (tool name, arguments), score)
CASES: dict[str, tuple[Any, ...]] = {
    "json ok": ("json", JSON_SCHEMA_FORMAT, None, '{"id": 7}', 1.0),
    "json wrong type": ("json", JSON_SCHEMA_FORMAT, None, '{"id": "seven"}', 0.0),
    "json not json": ("json", {"type": "json_object"}, None, 'Sure! {"id": 7}', 0.0),
    "tool ok": ("tool_call", None, TOOLS, ("lookup_order", {"order_id": "A1"}), 1.0),
    "tool bad arguments": ("tool_call", None, TOOLS, ("lookup_order", {"order": 5}), 0.0),
    "tool unknown": ("tool_call", None, TOOLS, ("delete_order", {"order_id": "A1"}), 0.0),
    "tell me a story": (None, None, None, "Once upon a time.", None),
}


def _item(prompt: str, split: str = "test") -> EvalSetItem:
    signal, response_format, tools, _, _ = CASES[prompt]
    return EvalSetItem(id=f"item-{prompt.replace(' ', '-')}", split=split,  # type: ignore[arg-type]
                       messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}],
                       tools=tools, signal=signal, period="2026-01", response_format=response_format)  # fmt: skip


def publish_set(
    root: Path, items: list[EvalSetItem], name: str = "traffic-shop", version: str = "2026-01"
) -> str:
    source = root / "src"
    source.mkdir(parents=True, exist_ok=True)
    (source / "items.jsonl").write_text("".join(item.model_dump_json() + "\n" for item in items))
    open_registry(str(root / "registry")).publish(source, name, version, kind="evalset")
    return f"{name}@{version}"


class Policy:
    """The mock model: answers each prompt as CASES says and records what the replay offered it."""

    def __init__(self) -> None:
        self.offered: dict[str, tuple[list[str], Any]] = {}

    def __call__(self, messages: list[ChatMessage], tools: Any, choice: Any, config: Any) -> ModelOutput:
        prompt = next(m.text for m in reversed(messages) if isinstance(m, ChatMessageUser))
        self.offered[prompt] = ([t.name for t in tools], config.response_schema)
        answer = CASES[prompt][3]
        if isinstance(answer, tuple):
            return _with_usage(ModelOutput.for_tool_call("mockllm", answer[0], answer[1]))
        return _with_usage(ModelOutput.from_content("mockllm", answer))


def _with_usage(output: ModelOutput) -> ModelOutput:
    # With usage attached, mockllm does not count tokens with tiktoken (which downloads its encoding).
    output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
    return output


@pytest.fixture
def published(tmp_path: Path) -> tuple[str, str]:
    items = [_item(prompt) for prompt in CASES] + [
        _item("json ok", split="dev").model_copy(update={"id": "dev-1"})
    ]
    return publish_set(tmp_path, items), str(tmp_path / "registry")


def test_traffic_is_a_replay_family_outside_the_generated_suite() -> None:
    assert "traffic" in replay_family_names() and "traffic" not in family_names()


def test_the_replay_scores_json_and_tool_calls_and_leaves_the_rest_for_review(
    published: tuple[str, str], tmp_path: Path
) -> None:
    ref, registry = published
    policy = Policy()
    logs = run_eval(get_model("mockllm/model", custom_outputs=policy), ["traffic"], "test", 20,
                    log_dir=tmp_path / "logs", family_options={"traffic": {"set": ref, "registry": registry}})  # fmt: skip
    (log_path,) = logs
    eval_log = read_eval_log(str(log_path))
    assert eval_log.status == "success", eval_log.error
    scores = {str(s.id): s.scores["traffic_scorer"] for s in eval_log.samples or [] if s.scores}
    assert len(scores) == len(CASES)  # the dev item is not replayed on the test split
    for prompt, (signal, _, tools, _, expected) in CASES.items():
        score = scores[f"item-{prompt.replace(' ', '-')}"]
        assert (score.metadata or {})["needs_review"] is (signal is None)
        if expected is None:
            assert math.isnan(float(score.value)) and score.reason == "needs_review"  # type: ignore[arg-type]
        else:
            assert score.value == expected, (prompt, score.explanation)
        offered_tools, schema = policy.offered[prompt]
        assert offered_tools == ([t["function"]["name"] for t in tools] if tools else [])
        assert (schema is not None) == (prompt.startswith("json") and prompt != "json not json")
    # Inspect leaves the NaN (needs review) score out: accuracy is over the 6 auto-scored items.
    (result,) = eval_log.results.scores if eval_log.results else []
    assert result.scored_samples == 6 and result.unscored_samples == 1
    assert result.metrics["mean"].value == pytest.approx(2 / 6)
    # The gate reads only generated families: traffic samples are not release-gate outcomes.
    assert read_outcomes(tmp_path / "logs") == []

    answers = read_answers(tmp_path / "logs")
    assert set(answers) == set(scores)
    ok = answers["item-tool-ok"]
    assert (
        ok.set_ref == ref
        and ok.model == "mockllm/model"
        and ok.signal == "tool_call"
        and ok.auto_score == 1.0
    )
    assert ok.tools == TOOLS and ok.messages[-1] == {"role": "user", "content": "tool ok"}
    assert not ok.needs_review
    (call,) = ok.tool_calls or []
    assert call["function"]["name"] == "lookup_order" and json.loads(call["function"]["arguments"]) == {
        "order_id": "A1"
    }
    story = answers["item-tell-me-a-story"]
    assert (
        story.needs_review
        and story.auto_score is None
        and story.answer == "Once upon a time."
        and story.tool_calls is None
    )
    assert answers["item-json-ok"].auto_score == 1.0 and answers["item-json-wrong-type"].auto_score == 0.0
    assert all(a.split == "test" and a.period == "2026-01" for a in answers.values())
    assert list_eval_logs(str(tmp_path / "logs"))


def test_read_answers_prefers_the_newest_log_and_refuses_an_empty_dir(
    published: tuple[str, str], tmp_path: Path
) -> None:
    ref, registry = published
    options = {"traffic": {"set": ref, "registry": registry}}
    run_eval(get_model("mockllm/model", custom_outputs=Policy()), ["traffic"], log_dir=tmp_path / "logs", limit=2,
             seed=1, family_options=options)  # fmt: skip
    first = read_answers(tmp_path / "logs")
    assert len(first) == 2
    run_eval(get_model("mockllm/model", custom_outputs=lambda *_: _with_usage(ModelOutput.from_content("mockllm", "rerun"))),
             ["traffic"], log_dir=tmp_path / "logs", limit=20, family_options=options)  # fmt: skip
    rerun = read_answers(tmp_path / "logs")
    assert len(rerun) == len(CASES) and {a.answer for a in rerun.values()} == {"rerun"}
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalError, match="no traffic-family answers"):
        read_answers(tmp_path / "empty")
    with pytest.raises(EvalError, match="no such log directory"):
        read_answers(tmp_path / "absent")


def test_bad_requests_get_clear_errors(published: tuple[str, str], tmp_path: Path) -> None:
    ref, registry = published
    with pytest.raises(GeneratorError, match="needs the option 'set'"):
        build_tasks(["traffic"])
    with pytest.raises(GeneratorError, match="has no option 'sett'"):
        build_tasks(["traffic"], family_options={"traffic": {"sett": ref}})
    with pytest.raises(EvalError, match="not among the families run"):
        build_tasks(["documents"], family_options={"traffic": {"set": ref}})
    with pytest.raises(EvalError, match="splits dev, test"):
        build_tasks(
            ["traffic"], split="train", family_options={"traffic": {"set": ref, "registry": registry}}
        )
    with pytest.raises(ArtifactNotFound, match="traffic-nope@2026-01 not found"):
        build_tasks(
            ["traffic"], family_options={"traffic": {"set": "traffic-nope@2026-01", "registry": registry}}
        )
    source = tmp_path / "model"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"0")
    open_registry(registry).publish(source, "not-a-set", "v1", kind="model")
    with pytest.raises(EvalError, match="not an eval set"):
        build_tasks(["traffic"], family_options={"traffic": {"set": "not-a-set@v1", "registry": registry}})
    (task,) = build_tasks(
        ["traffic"], split="dev", family_options={"traffic": {"set": ref, "registry": registry}}
    )
    assert [sample.id for sample in task.dataset] == ["dev-1"]


def test_verifiers_directly() -> None:
    assert verify_json('  {"id": 1} ', None).correct
    assert not verify_json("```json\n{}\n```", None).correct
    assert verify_json('{"id": 1}', JSON_SCHEMA_FORMAT).score == 1.0
    assert "id" in verify_json("{}", JSON_SCHEMA_FORMAT).explanation
    call = {"function": {"name": "lookup_order", "arguments": '{"order_id": "A"}'}}
    bad = {"function": {"name": "lookup_order", "arguments": "{not json"}}
    assert verify_tool_calls([call], TOOLS).correct
    assert verify_tool_calls([call, bad], TOOLS).score == 0.5
    assert not verify_tool_calls(None, TOOLS).correct
