from __future__ import annotations

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
