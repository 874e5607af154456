from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_distill_draft import tiny_config

from distill import distill_draft
from distill.training import DraftDistiller
from infra.registry import FileRegistry


def test_auto_divergence_keeps_the_best_measured_candidate_and_caches_the_sweep(
    tiny_teacher_registry: FileRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config(
        tmp_path / "work",
        divergence="auto",
        divergence_candidates=["fkl", "tvd"],
        sweep_steps=2,
        steps=3,
        eval_prompts=4,
        publish=False,
    )
    manifest = distill_draft(config, registry=tiny_teacher_registry)
    sweep = {
        c: json.loads((tmp_path / "work" / f"sweep-{c}" / "result.json").read_text()) for c in ("fkl", "tvd")
    }
    best = max(sweep, key=lambda c: sweep[c]["acceptance"]["expected_acceptance"])
    assert manifest.metadata["divergence"] == best

    evaluations: list[int] = []
    original = DraftDistiller.evaluate

    def counting(self: DraftDistiller):  # type: ignore[no-untyped-def]
        evaluations.append(self.step)
        return original(self)

    monkeypatch.setattr(DraftDistiller, "evaluate", counting)
    again = distill_draft(config, registry=tiny_teacher_registry)
    assert again.metadata["divergence"] == best
    assert evaluations == [3]  # the sweep is read back, only the finished main run is re-measured
