from __future__ import annotations

from pathlib import Path

import pytest

from evalsuite.errors import EvalError
from evalsuite.runner import DEFAULT_GATEWAY_URL, build_tasks, resolve_model


def test_bare_ids_mean_the_local_gateway() -> None:
    model = resolve_model("tandem-fast")
    assert str(model) == "openai-api/tandem/tandem-fast" and model.api.base_url == DEFAULT_GATEWAY_URL
    other = resolve_model("openai/tandem-standard", "http://10.0.0.5:8000/v1")
    assert other.api.base_url == "http://10.0.0.5:8000/v1"


def test_build_tasks_validates_arguments() -> None:
    tasks = build_tasks(["documents", "agent"], split="dev", limit=3)
    assert [len(t.dataset) for t in tasks] == [3, 3]
    for bad in ({"families": ["poetry"]}, {"families": ["agent"], "split": "val"},
                {"families": ["agent"], "difficulty": "extreme"}):  # fmt: skip
        with pytest.raises(EvalError):
            build_tasks(**bad)  # type: ignore[arg-type]


def test_eval_command_writes_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import typer
    from evalsuite_oracles import documents_policy
    from inspect_ai.model import get_model
    from typer.testing import CliRunner

    import evalsuite.runner
    from evalsuite.cli import eval_command
    from evalsuite.gate import read_outcomes
    from evalsuite.generators import generate_instances

    instances = generate_instances("documents", "dev", 2, seed=5)
    seen: list[tuple[str, str | None]] = []

    def fake_resolve(model: str, base_url: str | None = None, **_: object) -> object:
        seen.append((model, base_url))
        return get_model("mockllm/tandem-fast", custom_outputs=documents_policy(instances, "right"))

    monkeypatch.setattr(evalsuite.runner, "resolve_model", fake_resolve)
    app = typer.Typer()
    app.command()(eval_command)
    args = ["--model", "tandem-fast", "--families", "documents", "--split", "dev", "--limit", "2", "--seed", "5",
            "--base-url", "http://127.0.0.1:9/v1", "--log-dir", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen == [("tandem-fast", "http://127.0.0.1:9/v1")]
    outcomes = read_outcomes(tmp_path)
    assert len(outcomes) == 2 and all(o.correct and o.model == "tandem-fast" for o in outcomes)
