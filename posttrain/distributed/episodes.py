"""Multi-turn episodes on the rollout engines: one scheduler job per prompt group.

A job is a Ray task that holds an engine's actor handle and plays ``num_generations`` episodes of one instance
concurrently (:func:`posttrain.episodes.play_group`): every turn is a ``generate`` call on that engine (so its
prefix cache keeps each episode's history), every tool call runs in the task's own environment session (a shop,
a bubblewrap sandbox, opened per episode), and the family's verifier scores the final state there, before the
session closes. The task returns each episode as a completion of the shape single-turn rollouts have, plus its
loss mask, prompt and verdict. Retries, quarantine and engine failures are the scheduler's, as for single-turn
groups.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from evalsuite.generators.base import derive_seed
from evalsuite.schema import TaskInstance
from posttrain.distributed.scheduler import Job

log = logging.getLogger(__name__)

# The task mostly waits on its engine; sandboxed commands run in their own processes.
_EPISODE_TASK_CPUS = 0.25
_remote_play: Any = None


def play_on_engine(
    handle: Any,
    *,
    instance: dict[str, Any],
    tokenizer_dir: str,
    sampling: dict[str, Any],
    episodes: dict[str, Any],
    max_turn_tokens: int,
    max_total_tokens: int,
    seeds: list[int],
) -> list[list[dict[str, Any]]]:
    """Play one episode per seed of ``instance`` on the engine ``handle`` (runs in a Ray worker); returns
    ``[completions]`` as the engine's ``generate`` does for one prompt, each completion one episode."""
    from posttrain.config import EpisodeConfig
    from posttrain.episodes import play_group
    from posttrain.episodes.policies import EnginePolicy
    from posttrain.episodes.tool_calls import load_tokenizer

    task = TaskInstance.model_validate(instance)
    tokenizer = load_tokenizer(tokenizer_dir)
    policy = EnginePolicy(handle, sampling)
    played = asyncio.run(
        play_group(
            [policy] * len(seeds),
            task,
            tokenizer,
            EpisodeConfig.model_validate(episodes),
            max_turn_tokens=max_turn_tokens,
            max_total_tokens=max_total_tokens,
            seeds=seeds,
        )
    )
    return [
        [
            {
                "token_ids": episode.completion_ids,
                "logprobs": episode.logprobs,
                "loss_mask": episode.loss_mask,
                "policy_version": min(episode.policy_versions, default=0),
                "prompt": episode.prompt,
                "prompt_ids": episode.prompt_ids,
                "text": str(tokenizer.decode(episode.completion_ids, skip_special_tokens=False)),
                "verdict": episode.traced_verdict(),
            }
            for episode in played
        ]
    ]


def _launch(handle: Any, **arguments: Any) -> Any:
    global _remote_play
    import ray

    if _remote_play is None:
        remote: Any = ray.remote(num_cpus=_EPISODE_TASK_CPUS, max_retries=0)
        _remote_play = remote(play_on_engine)
    return _remote_play.remote(handle, **arguments)


def episode_job(
    key: str,
    instance: TaskInstance,
    *,
    tokenizer_dir: str,
    sampling: dict[str, Any],
    episodes: dict[str, Any],
    max_turn_tokens: int,
    max_total_tokens: int,
    group: int,
    seed: int,
) -> Job:
    """The scheduler job that plays one instance's group of ``group`` episodes on whichever engine it gets."""
    return Job(
        key=key,
        domain=instance.family,
        kind="rollout",
        launch=partial(
            _launch,
            instance=instance.model_dump(mode="json"),
            tokenizer_dir=tokenizer_dir,
            sampling=sampling,
            episodes=episodes,
            max_turn_tokens=max_turn_tokens,
            max_total_tokens=max_total_tokens,
            seeds=[derive_seed("rl-episode", seed, member) for member in range(group)],
        ),
    )
