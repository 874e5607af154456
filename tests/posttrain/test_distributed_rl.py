"""GRPO on Ray (tiny random Llama, float32): 2 vLLM rollout engines + 2 Ray Train learners end to end, the
learner's rank-count invariance, a SIGKILLed driver that resumes, and the loss against TRL's formulas."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from evalsuite.schema import TaskInstance, VerifierResult
from posttrain import RLRunConfig, read_trace
from posttrain.distributed.learner import LearnerConfig, grpo_loss
from posttrain.distributed.rl import group_advantages
from posttrain.formats import _FORMATS
from tests.posttrain.trivial import LetterFormat, letter_instances

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


class TokenFormat(LetterFormat):
    """Correct when the one-token completion is exactly ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def score(self, instance: TaskInstance, completion: str) -> tuple[VerifierResult, float]:
        correct = completion == self.target
        return VerifierResult(score=float(correct), correct=correct), 1.0


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def _config(model_dir: Path, work: Path, **ray: Any) -> RLRunConfig:
    return RLRunConfig(
        base=str(model_dir),
        pool={"families": ["documents"]},
        num_generations=8,
        max_completion_length=1,
        top_k=4,
        train={"max_steps": 4, "batch_size": 1, "save_steps": 2, "learning_rate": 5e-3, "max_length": 64},
        reward={"length_penalty": 0.0},
        evaluate_before_after=False,
        output={"work_dir": str(work), "registry": f"file://{work.parent / 'registry'}"},
        ray={
            "engines": 2,
            "engine": {"num_cpus": 0.5, "engine": {"max_model_len": 256}},
            "learner": {"workers": 2, "cpus_per_worker": 0.5},
            **ray,
        },
    )


def _target(vllm_tiny_dir: Path) -> tuple[str, int, Any, Any]:
    """A token among the base policy's top 4 for the letter prompt (so top-k=4 sampling finds it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (instance,) = letter_instances(1)
    tokenizer = AutoTokenizer.from_pretrained(vllm_tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(vllm_tiny_dir)
    text = tokenizer.apply_chat_template(
        LetterFormat().messages(instance), tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        top = torch.topk(model(prompt_ids).logits[0, -1], 4).indices
    candidates = [tokenizer.decode([int(i)]) for i in top]
    target = next(c for c in candidates[1:] if c.strip() and candidates.count(c) == 1)
    return target, int(top[candidates.index(target)]), prompt_ids, instance


def _probability(model_dir: Path, prompt_ids: Any, token: int) -> float:
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        return float(torch.softmax(policy(prompt_ids).logits[0, -1], -1)[token])


def test_grpo_on_ray_with_two_engines_and_two_learners_raises_the_rewarded_token(
    vllm_tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_ray: None
) -> None:
    from posttrain.rl import posttrain_rl

    target, token, prompt_ids, instance = _target(vllm_tiny_dir)
    monkeypatch.setitem(_FORMATS, "documents", TokenFormat(target))
    progress: list[dict[str, Any]] = []
    config = _config(vllm_tiny_dir, tmp_path / "rl", max_staleness=1)
    result = posttrain_rl(config, instances=[instance], on_progress=progress.append)

    before = _probability(vllm_tiny_dir, prompt_ids, token)
    after = _probability(Path(result.model_dir), prompt_ids, token)
    assert after > 3 * before, (before, after)
    assert [int(row["step"]) for row in progress] == [1, 2, 3, 4]
    assert all(row["staleness"] <= 1 for row in progress)
    records = read_trace(Path(result.run_dir))
    rollouts = [r for r in records if r.kind == "rollout"]
    assert len(rollouts) == 4 * 8
    versions = {r.policy_version for r in rollouts}
    assert 0 in versions and versions <= {0, 1, 2, 3}
    steps = [r.event for r in records if r.kind == "event" and r.event and r.event["type"] == "learner_step"]
    # One token per completion; a stale sample outside the learner's current top 4 leaves the loss.
    assert len(steps) == 4 and all(0 < s["tokens"] <= 8 for s in steps), steps
    assert all(s["is_weight"] > 0.2 for s in steps), "behaviour and learner log-probs disagree"
    assert result.metrics["runtime"] == "ray" and result.metrics["learners"] == 2
    assert sorted(p.name for p in Path(result.run_dir).glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
    ]


def test_one_and_two_learner_ranks_take_the_same_step(
    vllm_tiny_dir: Path, tmp_path: Path, local_ray: None
) -> None:
    """The loss is normalised by the global token count, so 2 DDP ranks on half the batch each end at the same
    weights as 1 rank on all of it."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from safetensors.torch import load_file

    from posttrain.distributed.learner import LearnerSpec, StepChannel, learner_loop

    generator = torch.Generator().manual_seed(0)
    sequences = [
        {
            "prompt_ids": torch.randint(5, 500, (6 + i,), generator=generator).tolist(),
            "completion_ids": torch.randint(5, 500, (1 + i % 3,), generator=generator).tolist(),
            "logprobs": [-3.0] * (1 + i % 3),
            "advantage": float(i % 2) - 0.5,
        }
        for i in range(4)
    ]
    tokens = sum(len(s["completion_ids"]) for s in sequences)
    weights = {}
    for workers in (1, 2):
        channel = ray.remote(num_cpus=0)(StepChannel).options(max_concurrency=8).remote(workers)
        ray.get(
            channel.put.remote(
                0, [{"sequences": sequences[r::workers], "global_tokens": tokens} for r in range(workers)]
            )
        )
        spec = LearnerSpec(
            start_dir=str(vllm_tiny_dir),
            reference_dir=str(vllm_tiny_dir),
            start_step=0,
            max_steps=1,
            learning_rate=1e-2,
            max_grad_norm=1e9,
            temperature=1.0,
            beta=0.0,
            dtype="float32",
            seed=0,
            save_steps=1,
            run_dir=str(tmp_path / f"run-{workers}"),
            weights_dir=str(tmp_path / f"weights-{workers}"),
            learner=LearnerConfig(workers=workers, cpus_per_worker=0.5, micro_batch_size=1),
        )
        TorchTrainer(
            learner_loop,
            train_loop_config={"spec": spec.model_dump(mode="json"), "channel": channel},
            scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name=f"ranks-{workers}", storage_path=str(tmp_path / "ray-train")),
        ).fit()
        (published,) = ray.get(channel.wait_published.remote(0, 1.0))
        weights[workers] = load_file(published[1]["weights"])
        assert published[1]["stats"]["tokens"] == tokens
    base = load_file(str(vllm_tiny_dir / "model.safetensors"))
    for name, tensor in weights[1].items():
        assert torch.allclose(tensor, weights[2][name], atol=1e-5), name
    assert any(not torch.allclose(weights[1][n], base[n]) for n in weights[1] if n in base)


def test_grpo_loss_matches_trl_formulas() -> None:
    config = LearnerConfig(importance_sampling_cap=2.0)
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -3.5], [-0.5, -0.7]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    advantages = torch.tensor([1.0, -1.0])
    loss, stats = grpo_loss(logps, behaviour, advantages, mask, normalizer=3.0, config=config)
    loss.backward()
    # Ratio 1 on-policy: the gradient is -A * w / normalizer per token, w = min(exp(logp - behaviour), cap).
    weight = torch.clamp(torch.exp(logps.detach() - behaviour), max=2.0)
    expected = -advantages.unsqueeze(1) * weight * mask / 3.0
    assert logps.grad is not None and torch.allclose(logps.grad, expected)
    assert stats["tokens"] == 3 and stats["is_truncated"] == 1
    # TRL's GRPO advantages: (r - group mean) / (group std + 1e-4), unbiased std.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    grouped = rewards.view(-1, 3)
    trl = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
    assert torch.allclose(torch.tensor(group_advantages(rewards.tolist(), 3)), trl, atol=1e-6)


@pytest.mark.chaos
@pytest.mark.chaos_full  # ~170 s: make chaos runs it, make test stays under its time limit
def test_a_sigkilled_driver_resumes_from_its_checkpoint(
    vllm_tiny_dir: Path, tmp_path: Path, chaos_report: Callable[..., object]
) -> None:
    """The driver (its own local Ray, engines and learners) is killed once checkpoint-2 is sealed; the same
    command then resumes from step 2 and finishes, the trace holding each step's rollouts once."""
    work = tmp_path / "rl"
    config = _config(vllm_tiny_dir, work, max_staleness=0, num_cpus=8)
    config_path = tmp_path / "config.json"
    config_path.write_text(config.model_dump_json())
    script = textwrap.dedent(
        f"""
        import json, logging, sys
        logging.basicConfig(level=logging.INFO)
        sys.path.insert(0, {str(REPO)!r})
        from posttrain import RLRunConfig
        from posttrain.formats import _FORMATS
        from posttrain.rl import posttrain_rl
        from tests.posttrain.trivial import LetterFormat, letter_instances
        if __name__ == "__main__":
            config = RLRunConfig.model_validate_json(open({str(config_path)!r}).read())
            _FORMATS["documents"] = LetterFormat()
            result = posttrain_rl(config, instances=letter_instances(1))
            print("RESULT", json.dumps(result.metrics))
        """
    )
    (tmp_path / "driver.py").write_text(script)
    log = tmp_path / "driver.log"

    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, str(tmp_path / "driver.py")],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
                env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
            )

    driver = start()
    sealed = work / "checkpoint-2" / "posttrain-checkpoint.json"
    deadline = time.monotonic() + 600
    try:
        while not sealed.is_file():
            assert driver.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    resumed = start()
    try:
        assert resumed.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if resumed.poll() is None:
            os.killpg(resumed.pid, signal.SIGKILL)
    text = log.read_text()
    assert "event=resume" in text and "step=2" in text
    metrics = json.loads(text.rsplit("RESULT", 1)[1].splitlines()[0])
    assert metrics["steps"] == 4
    records = read_trace(work)
    assert len([r for r in records if r.kind == "rollout"]) == 4 * 8
    assert [
        r.event["step"]
        for r in records
        if r.kind == "event" and r.event and r.event["type"] == "learner_step"
    ] == [1.0, 2.0, 3.0, 4.0]
    chaos_report(
        "SIGKILL of the GRPO driver (local Ray, 2 vLLM engines, Ray Train learner) after checkpoint-2",
        requests=4,
        failures=0,
        detail="resumed from step 2; 4 learner steps, each step's 8 rollouts traced once",
    )


def test_a_spent_time_budget_ends_the_run_with_a_checkpoint(
    vllm_tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_ray: None
) -> None:
    """With the budget spent before the first step is sampled, that step is the last: the learner trains it,
    writes checkpoint-1 and the run publishes it, nothing sampled past it."""
    from posttrain.rl import posttrain_rl

    (instance,) = letter_instances(1)
    monkeypatch.setitem(_FORMATS, "documents", LetterFormat())
    # One engine: in the full suite the session's bundled-model gateway holds ~10 GB, and with two engines
    # beside it Ray's memory monitor killed a learner here once (24 GB machine).
    config = _config(vllm_tiny_dir, tmp_path / "rl", max_staleness=1, engines=1)
    config = config.model_copy(update={"train": config.train.model_copy(update={"time_budget_s": 1e-3})})
    result = posttrain_rl(config, instances=[instance])
    assert result.metrics["steps"] == 1 and result.metrics["time_budget_spent"] is True
    run = Path(result.run_dir)
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    records = read_trace(run)
    assert len([r for r in records if r.kind == "rollout"]) == 8
    assert any(r.event and r.event["type"] == "time_budget_spent" for r in records if r.kind == "event")


def test_each_step_records_the_pass_rate_of_every_tier_it_sampled_and_the_curves_draw_them(
    tmp_path: Path,
) -> None:
    from evalsuite.generators import generate_instances
    from posttrain.distributed.rl import tier_pass_rates
    from posttrain.run import save_curves

    easy = generate_instances("documents", "train", 2, seed=0, difficulty="easy")
    hard = generate_instances("documents", "train", 1, seed=0, difficulty="hard")
    rates = tier_pass_rates([easy[0], easy[0], easy[1], hard[0]], [True, False, True, False])
    assert rates == {"pass_rate_easy": 2 / 3, "pass_rate_hard": 0.0}  # medium was not sampled: no key

    history = [
        {"step": 1.0, "reward": 0.2, "kl": 0.0, "staleness": 1.0} | rates,
        {"step": 2.0, "reward": 0.4, "kl": 0.01, "staleness": 0.0, "pass_rate_easy": 1.0},
    ]
    path = save_curves(history, tmp_path / "curves.png", "t")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert save_curves([{"step": 1.0}], tmp_path / "none.png", "t") is None
