"""Fast unit tests: rewards, pool curriculum, formats, traces, checkpoints, spike detector, CLI config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsuite.generators import generate_instances
from evalsuite.schema import TaskInstance
from infra.errors import ConfigError
from posttrain import (
    CheckpointCorrupted,
    RewardConfig,
    RolloutRecord,
    TaskPool,
    TaskPoolConfig,
    TraceCorrupted,
    TraceWriter,
    UnsupportedFamily,
    combine_reward,
    format_for,
    read_trace,
)
from posttrain.checkpoints import RunState, load_checkpoint, seal_checkpoint
from posttrain.errors import PosttrainError
from posttrain.guards import RewardHackingCanary, SpikeDetector


def test_reward_outcome_first_and_clipped() -> None:
    config = RewardConfig()
    right = combine_reward(config, True, 1.0, 1.0, 0.5)
    wrong_but_formatted = combine_reward(config, False, 0.0, 1.0, 0.0)
    assert right > 0.9 > 0.2 > wrong_but_formatted > 0
    assert combine_reward(config, False, 0.0, 0.0, 1.0) == 0.0
    assert combine_reward(RewardConfig(correct_weight=3.0), True, 1.0, 1.0, 0.0) == 1.0


def test_documents_demonstrations_pass_the_verifier_and_wrong_answers_fail() -> None:
    rollout = format_for("documents")
    for instance in generate_instances("documents", "train", 8, seed=3):
        result, protocol = rollout.score(instance, rollout.demonstration(instance))
        assert result.correct and protocol == 1.0, result.explanation
        assert rollout.score(instance, "I am not sure.")[0].correct is False
        # The policy sees only the system instruction and the instance prompt, never the expected dict.
        shown = json.dumps(rollout.messages(instance))
        assert "expected" not in shown and "tolerance" not in shown


@pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="bubblewrap not installed")
def test_terminal_reference_script_passes_in_the_sandbox() -> None:
    rollout = format_for("terminal")
    (instance,) = generate_instances("terminal", "train", 1, seed=0)
    assert rollout.score(instance, rollout.demonstration(instance))[0].correct
    assert not rollout.score(instance, "```bash\ntrue\n```")[0].correct
    assert rollout.score(instance, "no script here")[1] == 0.0


def test_a_family_without_its_protocol_is_refused_with_a_clear_error() -> None:
    # agent trains as multi-turn episodes (tests/posttrain/test_episodes.py); it has no single-turn format.
    with pytest.raises(
        UnsupportedFamily, match=r"supported: documents, (\w+, )*terminal\); families with an"
    ):
        TaskPool(TaskPoolConfig(families=["agent"], rollout={"agent": "single_turn"}))
    with pytest.raises(UnsupportedFamily, match=r"'documents' has no episode environment"):
        TaskPool(TaskPoolConfig(families=["documents"], rollout={"documents": "episode"}))


def test_pool_balances_families_drops_degenerate_groups_and_promotes_tiers() -> None:
    pool = TaskPool(
        TaskPoolConfig(families=["documents", "terminal"], instances_per_family=12, min_attempts_to_promote=4)
    )
    mix = [pool.instance(i).family for i in pool.balanced(10)]
    assert mix.count("documents") == mix.count("terminal") == 5
    assert all(pool.instance(i).difficulty == "easy" for i in pool.balanced(10))
    easy_docs = pool._in_tier("documents")
    assert pool.record_group(easy_docs[0], [True, False]) is True
    assert pool.record_group(easy_docs[1], [False, False]) is False
    assert easy_docs[1] not in pool._eligible("documents")
    assert pool.state.dropped_groups == 1 and pool.state.kept_groups == 1
    pool.record_group(easy_docs[2], [True, True, True, True])
    pool.record_group(easy_docs[3], [True, True, True, True])
    assert pool.state.tiers["documents"] == "medium"
    assert pool.state.tiers["terminal"] == "easy"


def test_pool_leaves_out_prompts_over_the_token_budget_and_draws_the_same_on_resume() -> None:
    import random

    pool = TaskPool(TaskPoolConfig(families=["documents"], instances_per_family=12, start_tier="medium"))
    long_ids = set(pool._in_tier("documents")[::2])  # every other prompt is "too long"

    def tokens(instance: TaskInstance) -> int:
        return 900 if instance.instance_id in long_ids else 100

    def rng(draw: int) -> random.Random:
        return random.Random(draw)

    drawn = pool.draw_fitting(8, rng, tokens, budget=500, setting="train.max_length")
    assert len(drawn) == 8 and not long_ids & {i.instance_id for i in drawn}
    assert pool.state.too_long > 0 and pool.state.draws == 8 + pool.state.too_long
    replay = TaskPool(TaskPoolConfig(families=["documents"], instances_per_family=12, start_tier="medium"))
    assert [i.instance_id for i in replay.draw_fitting(8, rng, tokens, 500, "train.max_length")] == [
        i.instance_id for i in drawn
    ]
    with pytest.raises(PosttrainError, match=r"more than 50 tokens \(ray.engine.engine.max_model_len"):
        pool.draw_fitting(1, rng, tokens, budget=50, setting="ray.engine.engine.max_model_len", max_skips=3)


def test_pool_refuses_held_out_instances() -> None:
    leaked = generate_instances("documents", "test", 1, seed=0)
    with pytest.raises(Exception, match="train-split instances only"):
        TaskPool(TaskPoolConfig(families=["documents"]), leaked)


def _trace(tmp_path: Path) -> Path:
    writer = TraceWriter(tmp_path)
    for step in range(3):
        writer.write(RolloutRecord(stage="rl", policy_version=step, completion=f"c{step}", reward=0.5))
    writer.event("rl", 3, type="rollback", to="checkpoint-2")
    writer.seal()
    return writer.path


def test_trace_roundtrip_and_corruption_refused(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    records = read_trace(path)
    assert [r.policy_version for r in records] == [0, 1, 2, 3] and records[-1].kind == "event"
    path.write_text(path.read_text().replace('"c1"', '"cX"'))
    with pytest.raises(TraceCorrupted, match="sha256 does not match"):
        read_trace(path)


def test_trace_with_a_malformed_record_is_refused_even_when_resealed(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    with path.open("a") as handle:
        handle.write('{"stage": "rl"}\n')
    writer = TraceWriter(tmp_path)
    writer.seal()
    with pytest.raises(TraceCorrupted, match="line 5 is not a valid rollout record"):
        read_trace(path)


def test_corrupted_or_foreign_checkpoint_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights" * 100)
    seal_checkpoint(checkpoint, RunState(config_digest="abc", step=2))
    assert load_checkpoint(checkpoint, "abc").step == 2
    with pytest.raises(CheckpointCorrupted, match="another configuration"):
        load_checkpoint(checkpoint, "def")
    (checkpoint / "model.safetensors").write_bytes(b"weightz" * 100)
    with pytest.raises(CheckpointCorrupted, match="does not match its sha256"):
        load_checkpoint(checkpoint, "abc")


def test_time_budget_and_output_do_not_change_the_resume_digest() -> None:
    from posttrain import SFTRunConfig
    from posttrain.checkpoints import config_digest

    def digest(work_dir: str = "/tmp/a", **train: object) -> str:
        return config_digest(SFTRunConfig(base="b", train=train, output={"work_dir": work_dir}))

    assert digest(time_budget_s=60) == digest(time_budget_s=3600) == digest() == digest("/tmp/b")
    assert digest(learning_rate=1e-4) != digest(learning_rate=2e-4)


def test_spike_detector_and_canary() -> None:
    detector = SpikeDetector(factor=5.0, floor=1.0, window=4, min_history=2)
    assert detector.observe({"loss": 10.0}) == [] and detector.observe({"loss": 9.0}) == []
    assert detector.observe({"loss": 500.0})
    assert detector.series["loss"] == [10.0, 9.0]  # spikes never enter the running median
    assert detector.observe({"loss": 0.01}) == []
    canary = RewardHackingCanary(patience=2)
    assert not canary.observe(0.1, 0.5)
    assert not canary.observe(0.2, 0.4)
    assert canary.observe(0.3, 0.3)


def test_cli_config_errors_name_the_field(tmp_path: Path) -> None:
    from posttrain.cli import build_config
    from posttrain.stages import RLRunConfig

    config = build_config(RLRunConfig, None, "m@v", "documents,terminal", {"train": {"max_steps": 3}})
    assert config.pool.families == ["documents", "terminal"] and config.train.max_steps == 3
    path = tmp_path / "rl.yaml"
    path.write_text("train:\n  learning_rate: -1\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        build_config(RLRunConfig, path, "m@v", "documents", {})
    with pytest.raises(ConfigError, match="families"):
        build_config(RLRunConfig, None, "m@v", "documents,chess", {})


def test_cli_app_has_the_three_stages_and_stays_light() -> None:
    import subprocess
    import sys

    from typer.testing import CliRunner

    from posttrain.cli import posttrain_app

    runner = CliRunner()
    for stage in ("sft", "rl", "dpo"):
        result = runner.invoke(posttrain_app, [stage, "--help"])
        assert result.exit_code == 0 and "--base" in result.output
    failed = runner.invoke(posttrain_app, ["rl", "--base", "m@v", "--tasks", "chess"])
    assert isinstance(failed.exception, ConfigError)
    probe = "import sys, posttrain.cli; print('torch' in sys.modules or 'trl' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
        == "False"
    )


def test_algorithms_are_registered_config_trainer_pairs_that_generate_the_cli() -> None:
    from posttrain import (
        DPORunConfig,
        PosttrainError,
        RLRunConfig,
        SFTRunConfig,
        algorithm_names,
        get_algorithm,
    )
    from posttrain.cli import posttrain_app

    assert algorithm_names() == ("sft", "rl", "dpo")
    assert [get_algorithm(n).config for n in algorithm_names()] == [SFTRunConfig, RLRunConfig, DPORunConfig]
    assert get_algorithm("rl").trainer == "posttrain.rl:posttrain_rl"
    commands = {c.name: c.callback for c in posttrain_app.registered_commands}
    assert list(commands) == list(algorithm_names())
    assert commands["dpo"].__doc__ == get_algorithm("dpo").summary  # type: ignore[union-attr]
    with pytest.raises(PosttrainError, match="allowed: sft, rl, dpo"):
        get_algorithm("ppo")
    with pytest.raises(PosttrainError, match="takes a SFTRunConfig"):
        get_algorithm("sft").train(DPORunConfig(base="b"))


def test_device_and_precision_come_from_config() -> None:
    from posttrain import SFTRunConfig, TrainConfig
    from posttrain.checkpoints import config_digest

    assert TrainConfig().resolved_device() == "cpu"  # this machine has no GPU
    assert TrainConfig().resolved_dtype() == "float32"
    assert TrainConfig(device="cuda", dtype="auto").resolved_dtype() == "bfloat16"
    assert TrainConfig(device="cpu", dtype="auto").resolved_dtype() == "float32"
    with pytest.raises(ValueError, match="device"):
        TrainConfig(device="tpu")  # type: ignore[arg-type]
    # A run may resume on other hardware: the device is not part of the resume digest.
    on = {d: config_digest(SFTRunConfig(base="b", train={"device": d})) for d in ("auto", "cpu", "cuda")}
    assert len(set(on.values())) == 1
