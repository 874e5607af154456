"""A trivial verifiable task for fast tests: a one-token completion is correct when it contains 'a'.

Registered under the ``documents`` family for the duration of a test, so the real pool, reward, trace and
trainers run unchanged around it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from evalsuite.schema import TaskInstance, VerifierResult
from posttrain import formats


class LetterFormat:
    family = "documents"

    def messages(self, instance: TaskInstance) -> list[dict[str, str]]:
        return [{"role": "user", "content": instance.prompt}]

    def demonstration(self, instance: TaskInstance) -> str:
        return "a a a a a a a a"

    def score(self, instance: TaskInstance, completion: str) -> tuple[VerifierResult, float]:
        correct = "a" in completion
        return VerifierResult(score=float(correct), correct=correct), 1.0


def letter_probability(model_dir: object, prompt: str) -> float:
    """Exact probability that the policy's first completion token contains 'a' (noise-free reward)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0, -1].float(), dim=-1)
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    hits = torch.tensor(["a" in tokenizer.convert_tokens_to_string([t]) for t in vocab])
    return float(probs[: len(hits)][hits].sum())


def letter_instances(n: int = 4) -> list[TaskInstance]:
    return [
        TaskInstance(
            instance_id=f"letter-{i}",
            family="documents",
            task_type="letter",
            difficulty="easy",
            split="train",
            seed=i,
            prompt=f"Write the letter a many times ({i}).",
        )
        for i in range(n)
    ]


@pytest.fixture()
def letter_task(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[TaskInstance]]:
    monkeypatch.setitem(formats._FORMATS, "documents", LetterFormat())
    yield letter_instances()
