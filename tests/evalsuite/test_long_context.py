"""The long_context family: seeded haystacks sized in the bundled tokenizer's tokens, needles at depth,
verifiers, a mockllm Inspect run, and the recall heatmap written by ``tandem eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from evalsuite_oracles import with_usage
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ChatMessage, ChatMessageUser, ModelOutput, get_model

from evalsuite.families.long_context import LongContextConfig, recall_grid, recall_heatmap, use_config
from evalsuite.families.long_context.haystack import token_counter
from evalsuite.families.long_context.prompt import LONG_CONTEXT_SYSTEM
from evalsuite.families.long_context.report import HEATMAP_FILE, NeedleOutcome
from evalsuite.families.long_context.task import long_context
from evalsuite.gate import GatePolicy
from evalsuite.generators import generate_instance, generate_instances
from evalsuite.registry import family_names
from evalsuite.schema import DIFFICULTIES, TaskInstance, split_of
from evalsuite.verifiers import verify

KINDS = ("number", "name", "table")
# Short haystacks keep the generation-heavy tests fast; the token-length test covers the full 8k ladder.
SHORT = LongContextConfig(max_length=2048)


def _haystack(instance: TaskInstance) -> str:
    return instance.prompt.split("<notes>\n", 1)[1].rsplit("\n</notes>", 1)[0]


def test_registered_everywhere_families_are_listed() -> None:
    assert "long_context" in family_names()
    assert "long_context" in GatePolicy().families


def test_generation_is_deterministic_and_splits_disjoint() -> None:
    with use_config(SHORT):
        first = generate_instances("long_context", "dev", 4, seed=3)
        assert [i.model_dump() for i in first] == [
            i.model_dump() for i in generate_instances("long_context", "dev", 4, seed=3)
        ]
        assert generate_instances("long_context", "dev", 4, seed=4)[0].instance_id != first[0].instance_id
        ids = {}
        for split in ("train", "dev", "test"):
            instances = generate_instances("long_context", split, 6, seed=1)
            assert all(i.split == split == split_of(i.metadata["digest"]) for i in instances)
            ids[split] = {i.instance_id for i in instances}
    assert not ids["train"] & ids["dev"] and not ids["train"] & ids["test"] and not ids["dev"] & ids["test"]


def test_metadata_carries_length_depth_and_needle() -> None:
    with use_config(SHORT):
        instances = generate_instances("long_context", "train", 6, seed=2)
    for instance in instances:
        meta = instance.metadata
        assert meta["needle"] == instance.task_type and meta["length"] in SHORT.lengths()
        assert meta["depth"] in SHORT.depths and meta["max_length"] == 2048
    assert SHORT.lengths() == [1024, 2048] and LongContextConfig().lengths() == [1024, 2048, 4096, 8192]
    assert LongContextConfig(max_length=6000).lengths() == [1024, 2048, 4096, 6000]
    assert LongContextConfig().lengths_for("hard") == [8192]


@pytest.mark.parametrize("kind", KINDS)
def test_needle_sits_at_the_requested_depth(kind: str) -> None:
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        with use_config(SHORT.model_copy(update={"depths": (depth,)})):
            instance = generate_instance("long_context", kind, "easy", seed=int(depth * 100) + 7)
        haystack, needle = _haystack(instance), instance.metadata["needle_text"]
        assert haystack.count(needle) == 1 and instance.metadata["depth"] == depth
        measured = haystack.index(needle) / (len(haystack) - len(needle))
        assert measured == pytest.approx(depth, abs=0.05), (kind, depth, measured)


def test_filler_is_varied_not_repeated() -> None:
    with use_config(SHORT):
        instance = generate_instance("long_context", "number", "hard", seed=5)
    sentences = [s for s in _haystack(instance).replace("\n", " ").split(". ") if s]
    assert len(set(sentences)) > 0.8 * len(sentences)


def test_prompt_fits_its_target_in_bundled_tokens() -> None:
    """The served prompt (chat template included) is within 10 % of the target and leaves the answer room."""
    counter = token_counter()
    if counter.name.startswith("estimate"):
        pytest.skip("bundled model not installed: token counts are estimates")
    from transformers import AutoTokenizer

    from infra.bundled import prepare_bundled_model

    tokenizer = AutoTokenizer.from_pretrained(prepare_bundled_model())
    config = LongContextConfig()
    seen = set()
    for difficulty in DIFFICULTIES:
        for seed in range(3):
            instance = generate_instance("long_context", KINDS[seed], difficulty, seed=seed)
            messages = [
                {"role": "system", "content": LONG_CONTEXT_SYSTEM},
                {"role": "user", "content": instance.prompt},
            ]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            served = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            target = instance.metadata["length"]
            seen.add(target)
            assert abs(served - target) <= 0.1 * target, (target, served)
            assert served <= config.budget(target) and served == pytest.approx(
                instance.metadata["prompt_tokens"], abs=8
            )
    assert seen == {1024, 2048, 4096, 8192}


@pytest.mark.parametrize("kind", KINDS)
def test_verifier_accepts_the_needle_and_rejects_others(kind: str) -> None:
    with use_config(SHORT):
        instance = generate_instance("long_context", kind, "easy", seed=11)
    expected = instance.expected["answer"]
    right = verify(instance, f"I found it.\nANSWER: {expected}")
    assert right.correct and right.score == 1.0
    assert verify(instance, f"ANSWER: {str(expected).upper()}.").correct
    if kind == "number":
        wrong = str(int(expected) + 1)
    else:  # a first name alone is not the full name; a cell with more in it is not the cell
        wrong = str(expected).split()[0] if kind == "name" else f"{expected} and more"
    assert not verify(instance, f"ANSWER: {wrong}").correct
    assert not verify(instance, "ANSWER: I could not find it").correct
    assert not verify(instance, "").correct and not verify(instance, "x" * 400).correct
    lenient = verify(instance, f"It says {expected}")
    assert lenient.correct and lenient.components["format"] == 0.0


def test_verifier_match_rules() -> None:
    with use_config(SHORT):
        number = generate_instance("long_context", "number", "easy", seed=1)
        name = generate_instance("long_context", "name", "easy", seed=1)
    code = int(number.expected["answer"])
    assert (
        verify(number, f"ANSWER: {code:,}").correct and verify(number, f"ANSWER: {code} is the code").correct
    )
    full = name.expected["answer"]
    assert verify(name, f"ANSWER: The keeper is {full.lower()}, I believe.").correct
    assert not verify(name, f"ANSWER: {full.split()[1]}").correct


def _policy(instances: list[TaskInstance], right: bool) -> Any:
    by_prompt = {i.prompt: i for i in instances}

    def answer(messages: list[ChatMessage], *_: Any) -> ModelOutput:
        instance = by_prompt.get(next(m.text for m in messages if isinstance(m, ChatMessageUser)))
        value = instance.expected["answer"] if right and instance else "nobody"  # other families: wrong
        return ModelOutput.from_content("mockllm", f"Found it.\nANSWER: {value}")

    return with_usage(answer)


@pytest.mark.parametrize("right", [True, False])
def test_mockllm_run(right: bool, tmp_path: Path) -> None:
    with use_config(SHORT):
        instances = generate_instances("long_context", "dev", 6)
    task = long_context(split="dev", n=6, max_length=2048)
    log = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=_policy(instances, right)),
                       log_dir=str(tmp_path), display="none")[0]  # fmt: skip
    assert log.status == "success", log.error
    scores = [next(iter(s.scores.values())) for s in log.samples or [] if s.scores]
    assert len(scores) == 6 and all((s.metadata or {})["correct"] is right for s in scores)


def test_recall_grid_and_heatmap(tmp_path: Path) -> None:
    results = [
        NeedleOutcome(1024, 0.0, True), NeedleOutcome(1024, 0.0, True), NeedleOutcome(1024, 0.0, False),
        NeedleOutcome(1024, 0.5, True), (8192, 0.5, False), (8192, 0.5, False), (8192, 1.0, True),
        (2048, 1.0, True), (2048, 1.0, False),
    ]  # fmt: skip
    assert recall_grid(results) == {
        (1024, 0.0): pytest.approx(2 / 3), (1024, 0.5): 1.0, (2048, 1.0): 0.5, (8192, 0.5): 0.0, (8192, 1.0): 1.0,
    }  # fmt: skip
    path = recall_heatmap(results, tmp_path / "out" / "heat.png", "synthetic")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_tandem_eval_writes_the_heatmap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evalsuite.runner import run_eval

    monkeypatch.setenv("TANDEM_LONG_CONTEXT_MAX_LENGTH", "2048")
    with use_config(SHORT):
        instances = generate_instances("long_context", "dev", 4, seed=5)
    model = get_model("mockllm/model", custom_outputs=_policy(instances, right=True))
    run_eval(model, ["long_context", "documents"], split="dev", limit=4, seed=5, log_dir=tmp_path)
    heatmap = tmp_path / HEATMAP_FILE
    assert heatmap.is_file() and heatmap.stat().st_size > 1000


@pytest.fixture
def models_endpoint() -> Any:
    """A stand-in gateway whose ``/v1/models`` lists two ids with their windows (what ``tandem serve`` reports)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps({"object": "list", "data": [
        {"id": "tandem-standard", "metadata": {"max_request_context_length": 8192}},
        {"id": "tandem-long", "metadata": {"max_request_context_length": 16384}},
    ]}).encode()  # fmt: skip

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/v1/models"
            self.send_response(200 if found else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body if found else b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_served_window_comes_from_the_gateway(models_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from evalsuite.runner import _long_context_window, served_window

    monkeypatch.delenv("TANDEM_LONG_CONTEXT_MAX_LENGTH", raising=False)
    assert served_window("tandem-long", models_endpoint) == 16384
    assert served_window("tandem-standard", models_endpoint) == 8192
    assert served_window("tandem-other", models_endpoint) is None
    assert served_window("tandem-long", "http://127.0.0.1:9/v1") is None  # nothing listens: the default
    assert _long_context_window("tandem-long", models_endpoint, {}) == {"max_length": 16384}
    chosen = {"long_context": {"max_length": "4096"}}
    assert _long_context_window("tandem-long", models_endpoint, chosen) == {"max_length": "4096"}
    monkeypatch.setenv("TANDEM_LONG_CONTEXT_MAX_LENGTH", "2048")
    assert _long_context_window("tandem-long", models_endpoint, {}) == {}


def test_family_options_reach_the_task_and_bad_ones_are_named() -> None:
    from evalsuite.errors import EvalError
    from evalsuite.runner import build_tasks

    (task,) = build_tasks(["long_context"], "dev", 3, family_options={"long_context": {"max_length": "2048"}})
    windows = {s.metadata["instance"]["metadata"]["max_length"] for s in task.dataset}  # type: ignore[index]
    assert windows == {2048}
    with pytest.raises(EvalError, match=r"long_context\.max_length='abc': Input should be a valid integer"):
        build_tasks(["long_context"], "dev", 3, family_options={"long_context": {"max_length": "abc"}})
    with pytest.raises(
        EvalError, match="family 'documents' has no option 'foo' \\(options it takes: none\\)"
    ):
        build_tasks(["documents"], "dev", 3, family_options={"documents": {"foo": "1"}})
