"""Multi-turn agentic episodes for post-training: the policy calls tools, the family's environment (the agent
family's shop, the terminal family's sandboxed shell) executes each call and answers with the next ``tool``
turn, up to the step budget; the family's verifier scores the final state, shaped with protocol compliance and
the step budget as the agent scorer shapes it. Tool calls are parsed with the served tiers' vLLM parser.

Families register an :class:`EpisodeEnvironment` with :func:`episode_environment`; the built-in ones (agent,
terminal) register on import of this package. Heavy libraries (vLLM, Inspect, torch) load on first use.
"""

from __future__ import annotations

from posttrain.episodes import agent as _agent  # noqa: F401  (registers the agent environment)
from posttrain.episodes import terminal as _terminal  # noqa: F401  (registers the terminal environment)
from posttrain.episodes.environments import (
    CallRecord,
    EpisodeEnvironment,
    EpisodeSession,
    ToolOutcome,
    environment_for,
    episode_environment,
    episode_families,
)
from posttrain.episodes.loop import Episode, EpisodeTooLong, Generation, Policy, run_episode
from posttrain.episodes.runner import (
    demonstration,
    play,
    play_group,
    renderer_for,
    require_room_for_turns,
    uses_episodes,
)
from posttrain.episodes.tool_calls import ParsedCall, ParsedTurn, ServedToolCalls
from posttrain.episodes.transcript import TranscriptRenderer

__all__ = [
    "CallRecord",
    "Episode",
    "EpisodeEnvironment",
    "EpisodeSession",
    "EpisodeTooLong",
    "Generation",
    "ParsedCall",
    "ParsedTurn",
    "Policy",
    "ServedToolCalls",
    "ToolOutcome",
    "TranscriptRenderer",
    "demonstration",
    "environment_for",
    "episode_environment",
    "episode_families",
    "play",
    "play_group",
    "renderer_for",
    "require_room_for_turns",
    "run_episode",
    "uses_episodes",
]
