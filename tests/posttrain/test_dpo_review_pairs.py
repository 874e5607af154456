"""DPO on human blind-review preferences (``--pairs reviews:<session>``), alone or with verifier-labelled pairs.

The preferences come from the registry artifact ``reviews-<session>`` (what ``tandem review export --pairs``
publishes); a tiny random Llama trains two steps on them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from evalsuite.schema import TaskInstance
from infra.manifest import Lineage
from infra.registry import open_registry
from posttrain import DPORunConfig, PosttrainError
from posttrain.common import StageContext
from posttrain.dpo import PREFERENCES_FILE, PreferenceMessage, PreferencePair, posttrain_dpo
from tests.posttrain.trivial import letter_task  # noqa: F401

REVIEWED = [
    PreferencePair(
        prompt=[PreferenceMessage(role="user", content=f"Is item {i} in stock?")],
        chosen=[PreferenceMessage(role="assistant", content=f"Yes, item {i} ships today.")],
        rejected=[PreferenceMessage(role="assistant", content="I cannot help with that.")],
        pair_id=f"pair-{i}",
    )
    for i in range(3)
]


def publish_reviews(registry_url: str, session: str, pairs: list[PreferencePair], version: str = "v1") -> str:
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / PREFERENCES_FILE).write_text("".join(p.model_dump_json() + "\n" for p in pairs))
        manifest = open_registry(registry_url).publish(
            Path(directory), f"reviews-{session}", version, kind="preferences",
            lineage=Lineage(parents=["traffic-support@2026-w49"], produced_by="test"),
        )  # fmt: skip
    return manifest.ref


def dpo_config(base: Path, tmp_path: Path, registry_url: str, pairs: list[str]) -> DPORunConfig:
    return DPORunConfig(
        base=str(base),
        pool={"families": ["documents"]},
        pairs=pairs,
        samples_per_prompt=2,
        max_completion_length=4,
        train={"max_steps": 2, "batch_size": 2, "save_steps": 2, "learning_rate": 1e-3, "max_length": 64},
        evaluate_before_after=False,
        output={"work_dir": str(tmp_path / "dpo"), "registry": registry_url},
    )


@pytest.fixture()
def trainer_datasets(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every train_dataset handed to a TRL trainer during the test."""
    seen: list[Any] = []
    original = StageContext.trl_trainer

    def recording(self: StageContext, trainer_class: Any, args: Any, tokenizer: Any, callbacks: list[Any],
                  **data: Any) -> Any:  # fmt: skip
        seen.append(data["train_dataset"])
        return original(self, trainer_class, args, tokenizer, callbacks, **data)

    monkeypatch.setattr(StageContext, "trl_trainer", recording)
    return seen


@pytest.mark.slow
def test_dpo_trains_on_review_pairs_alone(
    tiny_model_dir: Path, tmp_path: Path, registry_url: str, trainer_datasets: list[Any]
) -> None:
    ref = publish_reviews(registry_url, "support-w49", REVIEWED)
    result = posttrain_dpo(dpo_config(tiny_model_dir, tmp_path, registry_url, ["reviews:support-w49"]))
    assert result.metrics["steps"] == 2 and result.metrics["pairs"] == 3
    assert result.metrics["pair_sources"] == {ref: 3} and result.metrics["rollouts_traced"] == 0
    dataset = trainer_datasets[0]
    assert sorted(dataset["source"]) == [f"{ref}:pair-{i}" for i in range(3)]
    rows = sorted(dataset.to_list(), key=lambda row: row["source"])
    assert rows[0]["prompt"] == [{"role": "user", "content": "Is item 0 in stock?"}]
    assert rows[0]["chosen"] == [{"role": "assistant", "content": "Yes, item 0 ships today."}]
    assert rows[0]["rejected"] == [{"role": "assistant", "content": "I cannot help with that."}]
    lineage = open_registry(registry_url).manifest(str(result.candidate_ref)).lineage
    assert lineage.config["pairs"] == ["reviews:support-w49"] and lineage.metrics["pair_sources"] == {ref: 3}


@pytest.mark.slow
def test_dpo_mixes_review_pairs_with_verifier_pairs(
    tiny_model_dir: Path,
    tmp_path: Path,
    registry_url: str,
    trainer_datasets: list[Any],
    letter_task: list[TaskInstance],  # noqa: F811
) -> None:
    publish_reviews(registry_url, "support-w49", REVIEWED[:1], version="v1")
    ref = publish_reviews(registry_url, "support-w49", REVIEWED, version="v2")  # the newest version is read
    config = dpo_config(tiny_model_dir, tmp_path, registry_url, ["verifier", "reviews:support-w49"])
    result = posttrain_dpo(config, instances=letter_task)
    sources = result.metrics["pair_sources"]
    assert sources[ref] == 3 and sources["verifier"] >= 1
    assert result.metrics["pairs"] == 3 + sources["verifier"]
    kinds = {source.split(":", 1)[0] for source in trainer_datasets[0]["source"]}
    assert kinds == {ref, "verifier"}


def test_an_unknown_review_session_is_a_clear_error_before_any_training(
    tiny_model_dir: Path, tmp_path: Path, registry_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_model(self: StageContext) -> Any:
        raise AssertionError("the model must not load for an unknown session")

    monkeypatch.setattr(StageContext, "load_model", no_model)
    config = dpo_config(tiny_model_dir, tmp_path, registry_url, ["reviews:ghost"])
    with pytest.raises(PosttrainError, match=r"no review preferences reviews-ghost in .*tandem review export "
                                             r"--session ghost --pairs"):  # fmt: skip
        posttrain_dpo(config)
    publish_reviews(registry_url, "ghost", REVIEWED)
    with pytest.raises(PosttrainError, match="reviews-ghost@v9"):
        posttrain_dpo(dpo_config(tiny_model_dir, tmp_path, registry_url, ["reviews:ghost@v9"]))


def test_pair_sources_are_validated_and_reach_the_dpo_command_only(
    tiny_model_dir: Path, registry_url: str
) -> None:
    from posttrain.cli import posttrain_app

    assert DPORunConfig(base="b").pairs == ["verifier"]
    with pytest.raises(ValidationError, match=r"unknown pair sources \['human'\]"):
        DPORunConfig(base="b", pairs=["human"])
    with pytest.raises(ValidationError, match="unknown pair sources"):
        DPORunConfig(base="b", pairs=["reviews:Bad Session"])
    runner = CliRunner()
    refused = runner.invoke(posttrain_app, ["sft", "--base", "m@v", "--pairs", "verifier"])
    assert refused.exit_code == 2 and "--pairs applies to dpo" in refused.output
    unknown = runner.invoke(
        posttrain_app,
        [
            "dpo",
            "--base",
            str(tiny_model_dir),
            "--registry",
            registry_url,
            "--pairs",
            "verifier, reviews:nobody",
        ],
    )
    assert isinstance(unknown.exception, PosttrainError) and "reviews-nobody" in str(unknown.exception)
