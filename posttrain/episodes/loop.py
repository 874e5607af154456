"""The multi-turn episode loop: the policy generates a turn, the served parser reads its tool calls, the
family's environment executes each one and its results come back as the next ``tool`` turn, until the policy
replies without calling a tool, the turn budget is spent (the instance's step budget plus the eval's slack) or
the token budget is; then the family's verifier scores the final state.

The policy is anything with an async :meth:`Policy.generate` over token ids: a vLLM rollout engine on Ray, a
local model (held-out measurement), the reference solution (SFT demonstrations), a scripted test policy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from evalsuite.generators.base import derive_seed
from evalsuite.schema import TaskInstance, VerifierResult
from posttrain.config import EpisodeConfig
from posttrain.episodes.environments import CallRecord, EpisodeEnvironment, ToolOutcome
from posttrain.episodes.transcript import TranscriptRenderer
from posttrain.errors import PosttrainError

log = logging.getLogger(__name__)

EpisodeEnd = Literal["replied", "turn_limit", "token_limit"]


@dataclass(frozen=True)
class Generation:
    """One sampled turn: its token ids (the stop token included when sampled), the sampling log-prob of each,
    and the policy version that sampled it."""

    token_ids: list[int]
    logprobs: list[float]
    policy_version: int = 0


class Policy(Protocol):
    async def generate(self, prompt_ids: list[int], max_tokens: int, seed: int) -> Generation: ...


class Episode(BaseModel):
    """One finished episode: the tokens the learner trains on, what happened, and the verdict."""

    instance_id: str
    family: str
    difficulty: str
    prompt: list[dict[str, Any]]
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    """1 on the policy's own sampled tokens, 0 on what the template and the environment added."""
    logprobs: list[float]
    """Sampling log-prob per completion token (0.0 where the mask is 0)."""
    transcript: list[dict[str, Any]]
    """The turns after the prompt: assistant turns with their parsed tool calls, and tool turns."""
    calls: list[CallRecord]
    turns: int
    ended: EpisodeEnd
    policy_versions: list[int]
    verdict: VerifierResult

    @property
    def reward(self) -> float:
        """The verdict's shaped score clipped to [0, 1] (a forbidden call or a sandbox limit makes it 0)."""
        return min(1.0, max(0.0, self.verdict.score))

    @property
    def policy_tokens(self) -> int:
        return sum(self.loss_mask)

    def traced_verdict(self) -> dict[str, Any]:
        """The verdict as plain data, with the episode's turns and tool calls among its components (the trace
        shows them beside the verifier's)."""
        verdict = self.verdict.model_dump()
        verdict["components"] = {
            **verdict["components"],
            "turns": float(self.turns),
            "tool_calls": float(len(self.calls)),
        }
        return verdict


class EpisodeTooLong(PosttrainError):
    """An instance's opening prompt leaves no room for any turn in the token budget."""


async def run_episode(
    policy: Policy,
    instance: TaskInstance,
    environment: EpisodeEnvironment,
    renderer: TranscriptRenderer,
    config: EpisodeConfig,
    *,
    max_turn_tokens: int,
    max_total_tokens: int,
    seed: int,
) -> Episode:
    """Roll out one episode of ``instance`` with ``policy`` in a fresh session of ``environment``.

    ``max_turn_tokens`` bounds each turn, ``max_total_tokens`` the whole sequence (prompt, turns, tool turns); a
    turn cut by either is closed with the eos token outside the loss mask."""
    messages = environment.messages(instance)
    prompt_ids = renderer.prompt_ids(messages)
    if len(prompt_ids) >= max_total_tokens:
        raise EpisodeTooLong(
            f"{instance.family} instance {instance.instance_id}: its prompt with the tools is {len(prompt_ids)} "
            f"tokens, the episode budget is {max_total_tokens} (raise train.max_length)"
        )
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    transcript: list[dict[str, Any]] = []
    calls: list[CallRecord] = []
    versions: list[int] = []
    pending: list[int] = []  # the tool turn waiting to be fed before the next generation
    ended: EpisodeEnd = "turn_limit"
    turns = 0
    session = await environment.open(instance, config)
    try:
        for turn in range(instance.max_steps + config.turn_slack):
            room = max_total_tokens - len(prompt_ids) - len(completion) - len(pending)
            if room <= 0:
                ended = "token_limit"
                break
            completion += pending
            mask += [0] * len(pending)
            logprobs += [0.0] * len(pending)
            pending = []
            generated = await policy.generate(
                prompt_ids + completion, min(max_turn_tokens, room), derive_seed("episode-turn", seed, turn)
            )
            turns += 1
            versions.append(generated.policy_version)
            ids = list(generated.token_ids)
            sampled = list(generated.logprobs)[: len(ids)]
            completion += ids
            mask += [1] * len(ids)
            logprobs += sampled + [0.0] * (len(ids) - len(sampled))
            if not ids or ids[-1] != renderer.eos_id:  # cut by a budget: close the turn as the template does
                completion.append(renderer.eos_id)
                mask.append(0)
                logprobs.append(0.0)
            parsed = renderer.protocol.parse(renderer.turn_text(ids))
            transcript.append(
                {
                    "role": "assistant",
                    "content": parsed.content or "",
                    "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in parsed.calls],
                }
            )
            if not parsed.calls:
                ended = "replied"
                break
            results = []
            for call in parsed.calls:
                outcome = (
                    ToolOutcome(error=call.error)
                    if call.error is not None
                    else await session.call(call.name, call.arguments)
                )
                calls.append(CallRecord(name=call.name, arguments=call.arguments, error=outcome.error))
                results.append(
                    {"role": "tool", "content": outcome.message_text(), "tool_call_id": f"call_{len(calls)}"}
                )
            transcript += results
            pending = renderer.tool_turn_ids(results)
        verdict = await session.verdict(calls)
    finally:
        await session.close()
    log.debug(
        "event=episode_done instance=%s turns=%d calls=%d ended=%s score=%.3f",
        instance.instance_id,
        turns,
        len(calls),
        ended,
        verdict.score,
    )
    return Episode(
        instance_id=instance.instance_id,
        family=instance.family,
        difficulty=instance.difficulty,
        prompt=messages,
        prompt_ids=prompt_ids,
        completion_ids=completion,
        loss_mask=mask,
        logprobs=logprobs,
        transcript=transcript,
        calls=calls,
        turns=turns,
        ended=ended,
        policy_versions=versions,
        verdict=verdict,
    )
