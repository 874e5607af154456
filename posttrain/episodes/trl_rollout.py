"""Episodes in one process: a ``rollout_func`` for TRL's GRPOTrainer (``rl`` with ``ray: null``).

TRL hands the function the batch's prompts (one row per completion, groups consecutive) and the trainer; it
plays one episode per row with the trainer's own model and returns the token ids, the sampling log-probs and
TRL's ``env_mask`` (0 on what the template and the environment added, so the loss skips it), plus each
episode's verdict, which TRL forwards to :class:`~posttrain.rewards.VerifierReward`. Rows of single-turn
families in the same batch get one completion each, as TRL would sample them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from evalsuite.generators.base import derive_seed
from posttrain.episodes.policies import LocalModelPolicy
from posttrain.episodes.runner import play
from posttrain.errors import PosttrainError
from posttrain.pool import TaskPool
from posttrain.stages import RLRunConfig

VERDICT_FIELD = "episode_verdict"


def prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True)


class EpisodeRollout:
    """TRL ``rollout_func``; the prompt stream :meth:`remember`\\ s which instance each prompt it yields is."""

    def __init__(self, pool: TaskPool, tokenizer: Any, config: RLRunConfig) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        self.config = config
        self._instances: dict[str, str] = {}

    def remember(self, prompt: Any, instance_id: str) -> None:
        self._instances[prompt_key(prompt)] = instance_id

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        config, tokenizer = self.config, self.tokenizer
        policy = LocalModelPolicy(
            trainer.model,
            int(tokenizer.eos_token_id),
            tokenizer.pad_token_id,
            temperature=config.temperature,
            top_k=config.top_k,
        )
        out: dict[str, list[Any]] = {
            key: [] for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask", VERDICT_FIELD)
        }
        step = int(trainer.state.global_step)
        for row, prompt in enumerate(prompts):
            try:
                instance = self.pool.instance(self._instances[prompt_key(prompt)])
            except KeyError as exc:
                raise PosttrainError("rollout_func got a prompt the prompt stream never yielded") from exc
            seed = derive_seed("rl-local", config.train.seed, step, row)
            if self.pool.uses_episodes(instance.family):
                episode = play(
                    policy,
                    instance,
                    tokenizer,
                    config.episodes,
                    max_turn_tokens=config.max_completion_length,
                    max_total_tokens=config.train.max_length,
                    seed=seed,
                )
                prompt_ids, completion, logprobs = (
                    episode.prompt_ids,
                    episode.completion_ids,
                    episode.logprobs,
                )
                mask, verdict = episode.loss_mask, episode.traced_verdict()
            else:
                text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
                prompt_ids = list(tokenizer(text, add_special_tokens=False).input_ids)
                generated = asyncio.run(policy.generate(prompt_ids, config.max_completion_length, seed))
                completion, logprobs = generated.token_ids, generated.logprobs
                mask, verdict = [1] * len(completion), None
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(mask)
            out[VERDICT_FIELD].append(verdict)
        return out
