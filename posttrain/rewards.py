"""Verifier rewards for GRPO: outcome correctness first, then partial score, protocol compliance and a
small length penalty, clipped to [0, 1]; a multi-turn episode's reward is its verdict's shaped score (goal,
protocol, step budget, as the agent scorer weighs them). The reward side holds the instances; the policy sees
only ids and prompts, never the verifier or the expected answers."""

from __future__ import annotations

import logging
from typing import Any

from evalsuite.schema import VerifierResult
from posttrain.config import RewardConfig
from posttrain.pool import TaskPool
from posttrain.trace import RolloutRecord, TraceWriter
from posttrain.verify import verify_batch, with_known_verdicts

log = logging.getLogger(__name__)


def combine_reward(
    config: RewardConfig, correct: bool, score: float, protocol: float, length_fraction: float
) -> float:
    """The scalar reward of one rollout, clipped to [0, 1]."""
    raw = (
        config.correct_weight * float(correct)
        + config.score_weight * score
        + config.protocol_weight * protocol
        - config.length_penalty * min(max(length_fraction, 0.0), 1.0)
    )
    return min(1.0, max(0.0, raw))


def completion_text(completion: Any) -> str:
    """Text of a TRL completion (plain string or a list of chat messages)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content", "")) for message in completion)


class VerifierReward:
    """A TRL reward function: scores each completion with its instance's verifier, traces it, and grades
    each prompt's group in the task pool (dynamic sampling + curriculum)."""

    __name__ = "verifier_reward"

    def __init__(
        self,
        pool: TaskPool,
        config: RewardConfig,
        trace: TraceWriter,
        sampling: dict[str, Any],
        num_generations: int,
        max_completion_length: int,
    ) -> None:
        self.pool = pool
        self.config = config
        self.trace = trace
        self.sampling = sampling
        self.num_generations = num_generations
        self.max_completion_length = max_completion_length

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]] | None = None,
        instance_id: list[str] | None = None,
        trainer_state: Any = None,
        episode_verdict: list[dict[str, Any] | None] | None = None,
        **_: Any,
    ) -> list[float | None]:
        if instance_id is None:
            raise ValueError("the GRPO dataset must carry an 'instance_id' column")
        version = int(getattr(trainer_state, "global_step", 0))
        instances = [self.pool.instance(ident) for ident in instance_id]
        texts = [completion_text(completion) for completion in completions]
        lengths = [len(ids) for ids in completion_ids] if completion_ids else [len(t.split()) for t in texts]
        played = episode_verdict or [None] * len(texts)
        verdicts = with_known_verdicts(
            played,
            lambda pending: verify_batch(
                [instances[i] for i in pending], [texts[i] for i in pending], self.config.verify
            ),
        )
        episodes = [verdict is not None for verdict in played]
        return list(
            self.grade(prompts, texts, instance_id, lengths, [version] * len(texts), verdicts, episodes)
        )

    def grade(
        self,
        prompts: list[Any],
        texts: list[str],
        instance_ids: list[str],
        lengths: list[int],
        versions: list[int],
        verdicts: list[tuple[VerifierResult, float]],
        episodes: list[bool] | None = None,
    ) -> list[float]:
        """Rewards of whole groups (``num_generations`` consecutive completions per prompt) from their verdicts;
        each rollout is traced with the policy version that sampled it, each group graded in the pool.
        ``episodes`` marks the multi-turn episodes, whose verdict's shaped score is their reward."""
        rewards: list[float] = []
        outcomes: list[bool] = []
        for index, (prompt, text, ident, (result, protocol)) in enumerate(
            zip(prompts, texts, instance_ids, verdicts, strict=True)
        ):
            instance = self.pool.instance(ident)
            fraction = lengths[index] / self.max_completion_length
            if episodes is not None and episodes[index]:
                # An episode's verdict already has the seed's shape (goal, protocol, step budget; 0 for a
                # forbidden call or a sandbox limit): it is the reward, clipped.
                reward = min(1.0, max(0.0, result.score))
            else:
                reward = combine_reward(self.config, result.correct, result.score, protocol, fraction)
            rewards.append(reward)
            outcomes.append(result.correct)
            self.trace.write(
                RolloutRecord(
                    stage="rl",
                    policy_version=versions[index],
                    instance_id=ident,
                    family=instance.family,
                    difficulty=instance.difficulty,
                    group=index // self.num_generations,
                    prompt=prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}],
                    sampling=self.sampling,
                    completion=text,
                    reward=reward,
                    components={
                        **result.components,
                        "protocol": protocol,
                        "length_fraction": fraction,
                        "verifier_score": result.score,
                    },
                    correct=result.correct,
                    explanation=result.explanation,
                )
            )
            if (index + 1) % self.num_generations == 0:
                group = outcomes[-self.num_generations :]
                if not self.pool.record_group(ident, group):
                    self.trace.event(
                        "rl", versions[index], type="group_dropped", instance_id=ident, all_correct=all(group)
                    )
        return rewards
