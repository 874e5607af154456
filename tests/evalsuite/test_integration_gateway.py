"""Live run of the suite against the Tandem gateway; skipped unless TANDEM_GATEWAY_URL is set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evalsuite.gate import read_outcomes
from evalsuite.runner import run_eval

GATEWAY = os.environ.get("TANDEM_GATEWAY_URL")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not GATEWAY, reason="set TANDEM_GATEWAY_URL to run against a live gateway"),
]


@pytest.mark.parametrize("model", ["tandem-fast", "tandem-standard"])
def test_suite_runs_against_gateway(model: str, tmp_path: Path) -> None:
    paths = run_eval(model, ["documents", "agent"], split="dev", limit=2, base_url=GATEWAY, log_dir=tmp_path,
                     difficulty="easy")  # fmt: skip
    outcomes = read_outcomes(tmp_path)
    assert len(paths) == 2 and len(outcomes) == 4
    assert {o.model for o in outcomes} == {model}
