"""Held-out pass rate: greedy decoding (one turn, or whole tool episodes) on a split the policy never trains
on, scored by the evalsuite's verifiers (the same functions its Inspect scorers call)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from evalsuite.generators import generate_instances
from evalsuite.schema import Family, TaskInstance, VerifierResult
from posttrain.config import EpisodeConfig, EvalConfig
from posttrain.formats import format_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


class HeldOutReport(BaseModel):
    """Pass rate per family on a held-out split, with the instances' ids for pairing."""

    split: str
    seed: int
    pass_rate: dict[str, float]
    mean_score: dict[str, float]
    n: dict[str, int]
    outcomes: dict[str, bool] = Field(default_factory=dict, description="instance id -> correct")

    @property
    def overall(self) -> float:
        total = sum(self.n.values())
        return sum(self.pass_rate[f] * self.n[f] for f in self.n) / total if total else 0.0


def held_out_instances(config: EvalConfig, families: list[Family]) -> list[TaskInstance]:
    return [
        instance
        for family in families
        for instance in generate_instances(
            family, config.split, config.n_per_family, seed=config.seed, difficulty=config.difficulty
        )
    ]


def generate_greedy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: list[list[dict[str, str]]],
    max_new_tokens: int,
    batch_size: int = 4,
) -> list[str]:
    """Greedy completions for chat conversations (left-padded batches, no grad)."""
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations
    ]
    # Batch prompts of similar length together so padding stays small; answers go back in input order.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    texts = [texts[i] for i in order]
    outputs: list[str] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(
                texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(model.device)
            generated = model.generate(  # type: ignore[operator]
                **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            new = generated[:, batch["input_ids"].shape[1] :]
            outputs += tokenizer.batch_decode(new, skip_special_tokens=True)
    if was_training:
        model.train()
    restored = [""] * len(outputs)
    for position, index in enumerate(order):
        restored[index] = outputs[position]
    return restored


def measure_held_out(
    model: Any,
    tokenizer: Any,
    config: EvalConfig,
    families: list[Family],
    batch_size: int = 4,
    *,
    rollout: Mapping[str, str] | None = None,
    episodes: EpisodeConfig | None = None,
    max_total_tokens: int = 2048,
) -> HeldOutReport:
    """Pass rate of ``model`` on ``config.n_per_family`` held-out instances of each family.

    Families rolled out as episodes (``rollout``, as the pool decides) play greedy episodes through their
    environment, each turn up to ``config.max_new_tokens`` and the whole episode up to ``max_total_tokens``;
    the others answer in one greedy completion."""
    from posttrain.episodes import uses_episodes

    instances = held_out_instances(config, families)
    episodic = [i for i in instances if uses_episodes(i.family, rollout or {})]
    single = [i for i in instances if not uses_episodes(i.family, rollout or {})]
    completions = generate_greedy(
        model,
        tokenizer,
        [format_for(i.family).messages(i) for i in single],
        config.max_new_tokens,
        batch_size,
    )
    verdicts = {
        instance.instance_id: format_for(instance.family).score(instance, completion)[0]
        for instance, completion in zip(single, completions, strict=True)
    }
    verdicts |= _greedy_episodes(
        model, tokenizer, episodic, config, episodes or EpisodeConfig(), max_total_tokens
    )
    passed: dict[str, list[bool]] = {f: [] for f in families}
    scores: dict[str, list[float]] = {f: [] for f in families}
    outcomes: dict[str, bool] = {}
    for instance in instances:
        result = verdicts[instance.instance_id]
        passed[instance.family].append(result.correct)
        scores[instance.family].append(result.score)
        outcomes[instance.instance_id] = result.correct
    report = HeldOutReport(
        split=config.split,
        seed=config.seed,
        pass_rate={f: sum(v) / len(v) for f, v in passed.items() if v},
        mean_score={f: sum(v) / len(v) for f, v in scores.items() if v},
        n={f: len(v) for f, v in passed.items()},
        outcomes=outcomes,
    )
    log.info("event=held_out split=%s pass_rate=%s", config.split, report.pass_rate)
    return report


def _greedy_episodes(
    model: Any,
    tokenizer: Any,
    instances: list[TaskInstance],
    config: EvalConfig,
    episodes: EpisodeConfig,
    max_total_tokens: int,
) -> dict[str, VerifierResult]:
    """Verdicts of greedy episodes, one instance at a time (each in its own environment session)."""
    from posttrain.episodes import play
    from posttrain.episodes.policies import LocalModelPolicy

    policy = LocalModelPolicy(model, int(tokenizer.eos_token_id), tokenizer.pad_token_id)
    verdicts = {}
    for instance in instances:
        episode = play(
            policy,
            instance,
            tokenizer,
            episodes,
            max_turn_tokens=config.max_new_tokens,
            max_total_tokens=max_total_tokens,
        )
        verdicts[instance.instance_id] = episode.verdict
    return verdicts
