"""Playing episodes: which families are rolled out as episodes, one renderer per family and tokenizer, groups of
episodes played concurrently, and the reference solution played as an SFT demonstration."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from evalsuite.schema import TaskInstance
from infra.errors import ConfigError
from posttrain.config import EpisodeConfig
from posttrain.episodes.environments import environment_for, episode_families
from posttrain.episodes.loop import Episode, Policy, run_episode
from posttrain.episodes.policies import ReferencePolicy
from posttrain.episodes.transcript import TranscriptRenderer

# Renderers by (family, tokenizer, parser); the tokenizer is kept in the value so its id stays unique.
_RENDERERS: dict[tuple[str, int, str | None], tuple[Any, TranscriptRenderer]] = {}


def uses_episodes(family: str, rollout: Mapping[str, str]) -> bool:
    """Whether ``family`` is rolled out as multi-turn episodes under a pool's ``rollout`` choices; asking for
    episodes of a family without an environment raises :class:`~posttrain.errors.UnsupportedFamily`."""
    chosen = rollout.get(family)
    if chosen == "single_turn":
        return False
    if chosen == "episode":
        environment_for(family)
        return True
    return family in episode_families()


def renderer_for(family: str, tokenizer: Any, parser: str | None = None) -> TranscriptRenderer:
    """The transcript renderer of ``family``'s tools for ``tokenizer`` (built once)."""
    key = (family, id(tokenizer), parser)
    if key not in _RENDERERS:
        _RENDERERS[key] = (tokenizer, TranscriptRenderer(tokenizer, environment_for(family).tools(), parser))
    return _RENDERERS[key][1]


async def play_group(
    policies: Sequence[Policy],
    instance: TaskInstance,
    tokenizer: Any,
    config: EpisodeConfig,
    *,
    max_turn_tokens: int,
    max_total_tokens: int,
    seeds: Sequence[int],
) -> list[Episode]:
    """One episode of ``instance`` per policy (each in its own session), played concurrently."""
    environment = environment_for(instance.family)
    renderer = renderer_for(instance.family, tokenizer, config.tool_call_parser)
    return list(
        await asyncio.gather(
            *(
                run_episode(
                    policy,
                    instance,
                    environment,
                    renderer,
                    config,
                    max_turn_tokens=max_turn_tokens,
                    max_total_tokens=max_total_tokens,
                    seed=seed,
                )
                for policy, seed in zip(policies, seeds, strict=True)
            )
        )
    )


def play(
    policy: Policy,
    instance: TaskInstance,
    tokenizer: Any,
    config: EpisodeConfig,
    *,
    max_turn_tokens: int,
    max_total_tokens: int,
    seed: int = 0,
) -> Episode:
    """One episode, from synchronous code."""
    (episode,) = asyncio.run(
        play_group(
            [policy],
            instance,
            tokenizer,
            config,
            max_turn_tokens=max_turn_tokens,
            max_total_tokens=max_total_tokens,
            seeds=[seed],
        )
    )
    return episode


def demonstration(
    instance: TaskInstance, tokenizer: Any, config: EpisodeConfig, max_total_tokens: int
) -> Episode:
    """The generator's reference solution played through the real environment as an episode: its assistant
    turns are the template's tool-call rendering, its tool turns the environment's real results."""
    renderer = renderer_for(instance.family, tokenizer, config.tool_call_parser)
    policy = ReferencePolicy(
        renderer, environment_for(instance.family).reference_turns(instance), config.closing_reply
    )
    return play(
        policy,
        instance,
        tokenizer,
        config,
        max_turn_tokens=max_total_tokens,
        max_total_tokens=max_total_tokens,
    )


def require_room_for_turns(
    instances: Iterable[TaskInstance], tokenizer: Any, parser: str | None, budget: int, setting: str
) -> None:
    """Refuse a run whose episode budget (``setting`` = ``budget`` tokens) cannot hold an instance's opening
    prompt with its tools plus a turn, naming the setting, instead of failing episode by episode later."""
    longest: dict[str, int] = {}
    for instance in instances:
        renderer = renderer_for(instance.family, tokenizer, parser)
        length = len(renderer.prompt_ids(environment_for(instance.family).messages(instance)))
        longest[instance.family] = max(longest.get(instance.family, 0), length)
    if too_long := {family: length for family, length in longest.items() if length >= budget}:
        raise ConfigError(
            f"{setting}={budget} leaves no room for a turn: the episode prompts with their tools reach "
            + ", ".join(f"{length} tokens ({family})" for family, length in sorted(too_long.items()))
            + f"; raise {setting} well above {max(too_long.values())}"
        )
