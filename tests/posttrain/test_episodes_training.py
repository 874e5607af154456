"""Training on multi-turn episodes with a tiny random Llama (bundled tokenizer): SFT on the reference solutions'
tool-call transcripts, and GRPO on agent episodes in one process (TRL) and on Ray (vLLM engines, Ray Train)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from posttrain import RLRunConfig, SFTRunConfig, read_trace
from posttrain.common import StageContext

pytestmark = pytest.mark.slow
FAMILIES = ["agent", "terminal"] if Path("/usr/bin/bwrap").exists() else ["agent"]


def test_sft_on_agent_and_terminal_episodes_trains_on_the_assistant_turns(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import yaml
    from typer.testing import CliRunner

    from posttrain.cli import posttrain_app
    from posttrain.sft import demonstration_rows

    config = SFTRunConfig(
        base=str(tiny_model_dir),
        pool={"families": FAMILIES, "instances_per_family": 4},
        train={"max_steps": 2, "batch_size": 2, "save_steps": 2, "learning_rate": 1e-3, "max_length": 2048},
        eval={"n_per_family": 1, "max_new_tokens": 4},
        output={"work_dir": str(tmp_path / "sft"), "registry": f"file://{tmp_path / 'registry'}"},
    )
    context = StageContext(config, "sft")
    tokenizer = context.load_tokenizer()
    rows = demonstration_rows(context, 4, tokenizer)
    for row in rows:
        taught = [t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
        text = tokenizer.decode(taught)
        assert "<tool_call>" in text and "<tool_response>" not in text and text.endswith("Done.<|im_end|>")

    # Through the command line, as `tandem posttrain sft --tasks agent,terminal` (the rest from a config file).
    settings = config.model_dump(mode="json", exclude={"base", "output"})
    settings["pool"].pop("families")
    config_file = tmp_path / "sft.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    work = tmp_path / "sft-cli"
    invoked = CliRunner().invoke(
        posttrain_app,
        [
            *(
                "sft",
                "--base",
                str(tiny_model_dir),
                "--tasks",
                ",".join(FAMILIES),
                "--config",
                str(config_file),
            ),
            *("--work-dir", str(work), "--registry", f"file://{tmp_path / 'registry'}"),
        ],
    )
    assert invoked.exit_code == 0, invoked.output
    metrics = json.loads((work / "metrics.json").read_text())
    assert metrics["steps"] == 2 and math.isfinite(metrics["final_loss"])
    assert set(metrics["pass_rate_before"]) == set(FAMILIES)  # held-out measured as greedy episodes
    demos = [r for r in read_trace(work) if r.kind == "rollout"]
    assert {r.family for r in demos} == set(FAMILIES)
    assert all("<tool_call>" in r.completion and "<tool_response>" in r.completion for r in demos)


def _agent_rl_config(model_dir: Path, work: Path, **overrides: Any) -> RLRunConfig:
    return RLRunConfig(
        base=str(model_dir),
        pool={"families": ["agent"], "instances_per_family": 2},
        num_generations=2,
        max_completion_length=8,
        train={"max_steps": 1, "batch_size": 1, "save_steps": 1, "learning_rate": 1e-3, "max_length": 1536},
        evaluate_before_after=False,
        output={"work_dir": str(work), "registry": f"file://{work.parent / 'registry'}"},
        **overrides,
    )


def test_the_learner_trains_only_on_the_policy_tokens_of_an_episode(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from posttrain.distributed.learner import completion_logps

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    episode = {"prompt_ids": [1, 5, 6], "completion_ids": [7, 8, 9, 10, 2], "logprobs": [-1.0] * 5}
    masked = episode | {"loss_mask": [1, 0, 0, 1, 1]}
    _, _, mask, _ = completion_logps(model, [episode, masked], 1.0, False)
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 1, 1]]
    logps, _, _, _ = completion_logps(model, [masked], 1.0, False)
    assert torch.isfinite(logps).all()


def test_grpo_in_one_process_plays_agent_episodes(tiny_model_dir: Path, tmp_path: Path) -> None:
    from posttrain.rl import posttrain_rl

    result = posttrain_rl(_agent_rl_config(tiny_model_dir, tmp_path / "rl", ray=None))
    assert result.metrics["steps"] == 1
    rollouts = [r for r in read_trace(Path(result.run_dir)) if r.kind == "rollout"]
    assert len(rollouts) == 2 and {r.family for r in rollouts} == {"agent"}
    # Scored by the agent verifier's own shape: the reward is its score, with its components traced.
    assert all({"goal", "protocol", "budget"} <= set(r.components) for r in rollouts)
    assert all(r.reward == r.components["verifier_score"] and r.components["turns"] >= 1 for r in rollouts)


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_grpo_on_ray_plays_agent_episode_groups_on_the_rollout_engines(
    vllm_tiny_dir: Path, tmp_path: Path, local_ray: None
) -> None:
    from posttrain.rl import posttrain_rl

    config = _agent_rl_config(
        vllm_tiny_dir,
        tmp_path / "rl",
        ray={
            "engines": 1,
            "engine": {"num_cpus": 0.5, "engine": {"max_model_len": 1536}},
            "learner": {"workers": 1, "cpus_per_worker": 0.5},
            "max_staleness": 0,
        },
    )
    result = posttrain_rl(config)
    assert result.metrics["runtime"] == "ray" and result.metrics["steps"] == 1
    records = read_trace(Path(result.run_dir))
    rollouts = [r for r in records if r.kind == "rollout"]
    assert len(rollouts) == 2 and {r.family for r in rollouts} == {"agent"}
    assert all({"goal", "protocol", "budget", "turns", "tool_calls"} <= set(r.components) for r in rollouts)
    (step,) = [r.event for r in records if r.kind == "event" and r.event.get("type") == "learner_step"]
    assert step["tokens"] > 0
