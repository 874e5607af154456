"""vLLM rollout engines as Ray actors (tiny random Llama, float32): groups with per-token behaviour log-probs
that match the Hugging Face model, seeded sampling, and a weight push that changes what the engines sample."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines(vllm_tiny_dir: Path) -> Iterator[dict[str, Any]]:
    import ray

    from posttrain.distributed.engines import RolloutEngineConfig, start_engines

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    config = RolloutEngineConfig.model_validate({"num_cpus": 0.5, "engine": {"max_model_len": 256}})
    try:
        handles = start_engines(vllm_tiny_dir, config, 2, prefix="test")
        yield handles
        ray.get([h.shutdown.remote() for h in handles.values()])
    finally:
        ray.shutdown()


def _prompts() -> list[list[int]]:
    return [[1, 520, 33, 4012, 77, 9], [1, 3000, 41, 41, 1204]]


def _hf_logprobs(model: Any, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion).unsqueeze(1))[:, 0].tolist()


def test_engines_sample_seeded_groups_with_the_models_log_probs(
    engines: dict[str, Any], vllm_tiny_dir: Path
) -> None:
    import ray
    from transformers import AutoModelForCausalLM

    first, second = engines.values()
    sampling = {"n": 4, "temperature": 0.8, "top_p": 1.0, "top_k": None, "max_tokens": 6}
    a, b, other = ray.get([
        first.generate.remote(_prompts(), sampling, 7),
        second.generate.remote(_prompts(), sampling, 7),
        first.generate.remote(_prompts(), sampling, 8),
    ])  # fmt: skip
    assert [len(group) for group in a] == [4, 4]
    assert [[c["token_ids"] for c in group] for group in a] == [
        [c["token_ids"] for c in group] for group in b
    ]
    assert [[c["token_ids"] for c in group] for group in a] != [[c["token_ids"] for c in g] for g in other]
    assert len({tuple(c["token_ids"]) for c in a[0]}) > 1, "n completions of one prompt were all the same"
    model = AutoModelForCausalLM.from_pretrained(vllm_tiny_dir, dtype=torch.float32)
    for prompt, group in zip(_prompts(), a, strict=True):
        for completion in group:
            assert completion["policy_version"] == 0
            assert len(completion["logprobs"]) == len(completion["token_ids"]) == 6
            expected = _hf_logprobs(model, prompt, completion["token_ids"], 0.8)
            assert completion["logprobs"] == pytest.approx(expected, abs=2e-3)


def test_a_weight_push_changes_what_every_engine_samples(
    engines: dict[str, Any], vllm_tiny_dir: Path, tmp_path: Path
) -> None:
    import ray
    from transformers import AutoModelForCausalLM

    from posttrain.distributed.engines import save_weights_for_engines

    greedy = {"n": 1, "temperature": 0.0, "max_tokens": 8}
    model = AutoModelForCausalLM.from_pretrained(vllm_tiny_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter) * parameter.std())
    path = save_weights_for_engines(model, tmp_path / "policy-1.safetensors")
    assert not list(tmp_path.glob(".*partial"))
    before = ray.get(next(iter(engines.values())).generate.remote(_prompts(), greedy, 0))
    seconds = ray.get([handle.load_weights.remote(str(path), 1) for handle in engines.values()])
    assert all(s > 0 for s in seconds)
    after = ray.get([handle.generate.remote(_prompts(), greedy, 0) for handle in engines.values()])
    expected = []
    for prompt in _prompts():
        with torch.no_grad():
            tokens = model.generate(
                torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8
            )
        expected.append(tokens[0, len(prompt) :].tolist())
    for groups in after:
        assert [group[0]["token_ids"] for group in groups] == expected
        assert all(group[0]["policy_version"] == 1 for group in groups)
    assert [group[0]["token_ids"] for group in before] != expected, "the perturbation changed nothing"
    assert ray.get([h.policy_version.remote() for h in engines.values()]) == [1, 1]


def test_top_k_behaviour_log_probs_match_the_learners(engines: dict[str, Any], vllm_tiny_dir: Path) -> None:
    """With top-k the engine reports log-probs of the truncated distribution it sampled from; the learner
    scores the same tokens under the same truncation, so on-policy importance weights are 1."""
    import ray
    from transformers import AutoModelForCausalLM

    from posttrain.distributed.engines import save_weights_for_engines
    from posttrain.distributed.learner import completion_logps

    handle = next(iter(engines.values()))
    version = ray.get(handle.policy_version.remote())
    assert version in (0, 1)  # after the push test the engines hold the perturbed model; reload the base one
    model = AutoModelForCausalLM.from_pretrained(vllm_tiny_dir, dtype=torch.float32)
    path = save_weights_for_engines(model, vllm_tiny_dir.parent / "policy-base.safetensors")
    ray.get(handle.load_weights.remote(str(path), 2))
    sampling = {"n": 4, "temperature": 0.7, "top_k": 4, "max_tokens": 5}
    groups = ray.get(handle.generate.remote(_prompts(), sampling, 3))
    sequences = [
        {"prompt_ids": prompt, "completion_ids": c["token_ids"], "logprobs": c["logprobs"], "advantage": 0.0}
        for prompt, group in zip(_prompts(), groups, strict=True)
        for c in group
    ]
    with torch.no_grad():
        logps, _, mask, behaviour = completion_logps(model, sequences, 0.7, False, top_k=4)
    assert bool(mask.all())
    assert torch.allclose(logps, behaviour, atol=2e-3), (logps - behaviour).abs().max()
    assert float(behaviour.min()) > -2.0  # renormalised over 4 tokens, not the 49k vocabulary
