"""Live run of all three families against the bundled model behind the gateway (the session fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai.log import read_eval_log

from evalsuite.gate import read_outcomes
from evalsuite.runner import run_eval
from tests.conftest import Gateway

pytestmark = pytest.mark.integration

FAMILIES = ["terminal", "documents", "agent"]


@pytest.mark.parametrize("model", ["tandem-fast", "tandem-standard"])
def test_suite_runs_against_gateway(
    model: str, gateway: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_API_KEY", gateway.api_key)
    paths = run_eval(model, FAMILIES, split="dev", limit=1, base_url=gateway.openai_url, log_dir=tmp_path,
                     difficulty="easy", max_tokens=128)  # fmt: skip
    assert len(paths) == len(FAMILIES)
    for path in paths:
        log = read_eval_log(str(path))
        assert log.status == "success", log.error
        errors = [sample.error.message[:300] for sample in log.samples or [] if sample.error]
        assert not errors, f"{log.eval.task}: samples failed against the live model: {errors}"
    outcomes = read_outcomes(tmp_path)
    assert len(outcomes) == len(FAMILIES) and {o.model for o in outcomes} == {model}
