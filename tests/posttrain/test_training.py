"""Training tests on a tiny random Llama (hidden 64, 2 layers) with the bundled tokenizer.

Each runs a handful of optimizer steps on a trivial verifiable task (see ``trivial.py``) so the real
trainers, guards, checkpoints, traces and registry export run end to end in seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from evalsuite.schema import TaskInstance, VerifierResult
from infra.registry import open_registry
from posttrain import CheckpointCorrupted, RLRunConfig, SFTRunConfig, read_trace
from posttrain.formats import _FORMATS
from tests.posttrain.trivial import LetterFormat, letter_instances, letter_probability, letter_task  # noqa: F401

pytestmark = pytest.mark.slow


def _sft_config(tmp_path: Path, work: str, **train: Any) -> SFTRunConfig:
    return SFTRunConfig(
        base=str(tmp_path.parent / "unused"),
        pool={"families": ["documents"]},
        train={
            "max_steps": 4,
            "batch_size": 2,
            "save_steps": 2,
            "learning_rate": 1e-3,
            "max_length": 64,
            **train,
        },
        evaluate_before_after=False,
        output={"work_dir": str(tmp_path / work), "publish": False},
    )


def _weights(result: Any) -> dict[str, torch.Tensor]:
    return load_file(str(Path(result.model_dir) / "model.safetensors"))


class TokenFormat(LetterFormat):
    """Correct when the one-token completion is exactly ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def score(self, instance: TaskInstance, completion: str) -> tuple[VerifierResult, float]:
        correct = completion == self.target
        return VerifierResult(score=float(correct), correct=correct), 1.0


def test_grpo_reward_rises_on_a_trivial_verifiable_task(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.rl import posttrain_rl

    (instance,) = letter_instances(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    text = tokenizer.apply_chat_template(
        LetterFormat().messages(instance), tokenize=False, add_generation_prompt=True
    )
    with torch.no_grad():
        logits = model(tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids).logits[0, -1]
    top = torch.topk(logits, 4).indices
    candidates = [tokenizer.decode([int(i)]) for i in top]
    target = next(c for c in candidates[1:] if c.strip() and candidates.count(c) == 1)
    monkeypatch.setitem(_FORMATS, "documents", TokenFormat(target))

    target_id = int(top[candidates.index(target)])
    prompt_ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids

    def target_probability(model_dir: Path) -> tuple[float, float]:
        """P(target) under the full softmax and among the base's top-4 tokens (what rollouts sample)."""
        policy = AutoModelForCausalLM.from_pretrained(model_dir)
        with torch.no_grad():
            out = policy(prompt_ids).logits[0, -1]
        among_top = torch.softmax(out[top], -1)[candidates.index(target)]
        return float(torch.softmax(out, -1)[target_id]), float(among_top)

    config = RLRunConfig(
        base=str(tiny_model_dir),
        pool={"families": ["documents"]},
        num_generations=8,
        max_completion_length=1,
        top_k=4,
        train={"max_steps": 4, "batch_size": 1, "save_steps": 2, "learning_rate": 2e-2, "max_length": 64},
        reward={"length_penalty": 0.0},
        evaluate_before_after=False,
        output={"work_dir": str(tmp_path / "rl"), "registry": f"file://{tmp_path / 'registry'}"},
        ray=None,  # TRL's GRPOTrainer in this process (tests/posttrain/test_distributed_rl.py runs the Ray path)
    )
    result = posttrain_rl(config, instances=[instance])
    before, after = target_probability(tiny_model_dir), target_probability(Path(result.model_dir))
    # Noise-free check on the policy itself: the rewarded token gained probability mass.
    assert after[0] > 3 * before[0] and after[1] > before[1] + 0.15, (before, after)
    rollouts = [r for r in read_trace(Path(result.run_dir)) if r.kind == "rollout"]
    assert len(rollouts) == 4 * 8 and {r.policy_version for r in rollouts} == {0, 1, 2, 3}
    assert rollouts[0].sampling["top_k"] == 4 and "verifier_score" in rollouts[0].components
    # The candidate is in the registry with lineage pointing at its base and its run (trace included).
    registry = open_registry(config.output.registry)
    manifest = registry.manifest(str(result.candidate_ref))
    assert manifest.kind == "model" and manifest.lineage.parents == [str(tiny_model_dir), result.run_ref]
    assert manifest.lineage.metrics["task_set"]["split"] == "train"
    assert read_trace(registry.fetch(str(result.run_ref)))
    assert (Path(result.run_dir) / "curves.png").stat().st_size > 0


def test_resume_from_a_checkpoint_reproduces_the_state(
    tiny_model_dir: Path,
    tmp_path: Path,
    letter_task: list[TaskInstance],  # noqa: F811
) -> None:
    from posttrain.sft import posttrain_sft

    straight = posttrain_sft(
        _sft_config(tmp_path, "straight").model_copy(update={"base": str(tiny_model_dir)}),
        instances=letter_task,
    )

    class Crash(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 3:
                raise KeyboardInterrupt("simulated crash after the checkpoint at step 2")

    config = _sft_config(tmp_path, "resumed").model_copy(update={"base": str(tiny_model_dir)})
    with pytest.raises(KeyboardInterrupt):
        posttrain_sft(config, instances=letter_task, extra_callbacks=[Crash()])
    resumed = posttrain_sft(config, instances=letter_task)
    assert resumed.metrics["steps"] == straight.metrics["steps"] == 4
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)

    # A corrupted checkpoint is refused, with the file named, instead of being resumed silently.
    shutil.rmtree(Path(config.output.work_dir or "") / "candidate")
    newest = sorted(Path(config.output.work_dir or "").glob("checkpoint-*"))[-1]
    with (newest / "model.safetensors").open("r+b") as handle:
        handle.seek(200)
        handle.write(b"\x00\x01\x02\x03")
    with pytest.raises(CheckpointCorrupted, match=r"model\.safetensors"):
        posttrain_sft(config, instances=letter_task)


def test_sigterm_saves_a_checkpoint_and_the_same_command_resumes(
    tiny_model_dir: Path,
    tmp_path: Path,
    letter_task: list[TaskInstance],  # noqa: F811
) -> None:
    import json
    import os
    import signal

    from posttrain import TrainingInterrupted
    from posttrain.checkpoints import STATE_NAME
    from posttrain.sft import posttrain_sft

    class Terminate(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:  # step 3 is not a save_steps multiple: the stop itself saves it
                os.kill(os.getpid(), signal.SIGTERM)

    # A generous budget first; the resume may lower or raise it (the budget is not part of the run's identity).
    config = _sft_config(tmp_path, "stopped", time_budget_s=3600).model_copy(
        update={"base": str(tiny_model_dir)}
    )
    own_handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted, match=r"SIGTERM at step 3 with checkpoint-3 saved") as stopped:
        posttrain_sft(config, instances=letter_task, extra_callbacks=[Terminate()])
    assert stopped.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) is own_handler  # the training's handler is gone once it stops
    saved = json.loads((Path(config.output.work_dir or "") / "checkpoint-3" / STATE_NAME).read_text())
    assert saved["step"] == 3 and saved["train_seconds"] > 0
    resumed = posttrain_sft(
        config.model_copy(update={"train": config.train.model_copy(update={"time_budget_s": 1800})}),
        instances=letter_task,
    )
    assert resumed.metrics["steps"] == 4


def test_the_time_budget_spans_resumes() -> None:
    from posttrain.guards import TimeBudgetCallback, TrainingClock

    now = [100.0]
    clock = TrainingClock(spent_before=50.0, clock=lambda: now[0])  # 50 s spent before the restart
    budget = TimeBudgetCallback(60.0, clock)

    class Control:
        should_training_stop = False
        should_save = False

    class State:
        global_step = 7

    control = Control()
    now[0] = 105.0
    budget.on_step_end(None, State(), control)
    assert not control.should_training_stop and clock.spent() == 55.0
    now[0] = 111.0
    budget.on_step_end(None, State(), control)
    assert control.should_training_stop and control.should_save


def test_a_loss_spike_rolls_back_to_the_last_good_checkpoint(
    tiny_model_dir: Path,
    tmp_path: Path,
    letter_task: list[TaskInstance],  # noqa: F811
) -> None:
    from posttrain.sft import posttrain_sft

    class InjectSpike(TrainerCallback):
        fired = False

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
        ) -> None:
            if logs and "loss" in logs and state.global_step == 3 and not InjectSpike.fired:
                InjectSpike.fired = True
                logs["loss"] = 1e6

    config = _sft_config(tmp_path, "spike", max_steps=4).model_copy(update={"base": str(tiny_model_dir)})
    config.guards.spike_min_history = 2
    result = posttrain_sft(config, instances=letter_task, extra_callbacks=[InjectSpike()])
    assert InjectSpike.fired and result.metrics["rollbacks"] == 1 and result.metrics["steps"] == 4
    events = [r.event for r in read_trace(Path(result.run_dir)) if r.kind == "event"]
    assert [e["type"] for e in events] == ["spike", "rollback"] and events[1]["to"] == "checkpoint-2"


def test_a_rollback_feeds_the_data_in_a_new_order(
    tiny_model_dir: Path,
    tmp_path: Path,
    letter_task: list[TaskInstance],  # noqa: F811
) -> None:
    """Replaying the batches that spiked would spike again (seen on the bundled model: the same spike at
    step 53 after each rollback); after a rollback the trainer draws the same data in another order."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from posttrain.common import StageContext
    from posttrain.sft import demonstration_rows

    config = _sft_config(tmp_path, "order", max_steps=4).model_copy(update={"base": str(tiny_model_dir)})
    context = StageContext(config, "sft", letter_task)
    tokenizer = context.load_tokenizer()
    dataset = Dataset.from_list(demonstration_rows(context, 16))

    def first_batches(replay: int) -> list[list[list[int]]]:
        args = SFTConfig(**context.trainer_args(replay), max_length=64, completion_only_loss=True)
        trainer = SFTTrainer(
            model=context.load_model(), args=args, train_dataset=dataset, processing_class=tokenizer
        )
        batches = iter(trainer.get_train_dataloader())
        return [next(batches)["input_ids"].tolist() for _ in range(4)]

    assert first_batches(0) == first_batches(0)  # a resume without a rollback stays exact
    assert first_batches(1) != first_batches(0)
    assert first_batches(1) == first_batches(1)


def test_dpo_trains_on_verifier_labelled_pairs(
    tiny_model_dir: Path,
    tmp_path: Path,
    letter_task: list[TaskInstance],  # noqa: F811
) -> None:
    from posttrain import DPORunConfig
    from posttrain.dpo import posttrain_dpo

    config = DPORunConfig(
        base=str(tiny_model_dir),
        pool={"families": ["documents"]},
        samples_per_prompt=4,
        max_completion_length=4,
        train={"max_steps": 2, "batch_size": 2, "save_steps": 2, "learning_rate": 1e-3, "max_length": 64},
        evaluate_before_after=False,
        output={"work_dir": str(tmp_path / "dpo"), "registry": f"file://{tmp_path / 'registry'}"},
    )
    result = posttrain_dpo(config, instances=letter_task)
    assert result.metrics["steps"] == 2 and result.metrics["pairs"] >= 1
    rollouts = [r for r in read_trace(Path(result.run_dir)) if r.kind == "rollout"]
    assert len(rollouts) == 4 * 4 and {r.stage for r in rollouts} == {"dpo"}
    assert open_registry(config.output.registry).manifest(str(result.candidate_ref)).kind == "model"
