"""GRPO with verifier rewards (TRL GRPOTrainer): the policy samples groups of completions per prompt,
the eval suite's verifiers score them, the task pool's curriculum decides which prompts come next."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any

from evalsuite.generators.base import derive_seed
from evalsuite.schema import TaskInstance
from posttrain.common import StageContext, before_after
from posttrain.episodes import environment_for, require_room_for_turns
from posttrain.episodes.trl_rollout import EpisodeRollout
from posttrain.errors import PosttrainError
from posttrain.formats import format_for
from posttrain.pool import PoolState
from posttrain.rewards import VerifierReward
from posttrain.run import CandidateResult
from posttrain.stages import RLRunConfig

log = logging.getLogger(__name__)


def prompt_stream(
    context: StageContext, seed: int, rollout: EpisodeRollout | None = None
) -> Iterator[dict[str, Any]]:
    """Endless prompts drawn live from the pool (so the curriculum acts on the next batch); an episode family's
    prompt is its environment's opening, which ``rollout`` (the episode rollout_func) is told about."""
    for _ in itertools.count():
        draw = context.pool.state.draws
        context.pool.state.draws += 1
        (instance_id,) = context.pool.sample(1, random.Random(derive_seed("rl", seed, draw)))
        instance = context.pool.instance(instance_id)
        if context.pool.uses_episodes(instance.family):
            prompt = environment_for(instance.family).messages(instance)
        else:
            prompt = format_for(instance.family).messages(instance)
        if rollout is not None:
            rollout.remember(prompt, instance_id)
        yield {"prompt": prompt, "instance_id": instance_id}


def posttrain_rl(
    config: RLRunConfig,
    resume: bool = True,
    instances: list[TaskInstance] | None = None,
    extra_callbacks: list[Any] | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> CandidateResult:
    """GRPO from ``config.base`` on the train pool; publish the candidate with lineage and trace.

    With ``config.ray`` set (the default) the run goes through :mod:`posttrain.distributed` (``on_progress``
    receives each learner step); with ``ray: null``, through TRL's GRPOTrainer in this process."""
    if config.ray is not None:
        if extra_callbacks:
            raise PosttrainError("extra_callbacks are TRL trainer callbacks: set `ray: null` to use them")
        from posttrain.distributed.rl import posttrain_rl_ray

        return posttrain_rl_ray(config, resume, instances, on_progress)
    from datasets import IterableDataset
    from trl import GRPOConfig, GRPOTrainer

    context = StageContext(config, "rl", instances)
    tokenizer = context.load_tokenizer()
    train = config.train
    sampling = {
        "temperature": config.temperature,
        "max_completion_length": config.max_completion_length,
        "num_generations": config.num_generations,
        "top_p": 1.0,
        "top_k": config.top_k,
    }
    reward = VerifierReward(
        context.pool,
        config.reward,
        context.trace,
        sampling,
        config.num_generations,
        config.max_completion_length,
    )
    episodic = [i for i in context.pool.instances.values() if context.pool.uses_episodes(i.family)]
    require_room_for_turns(
        episodic, tokenizer, config.episodes.tool_call_parser, train.max_length, "train.max_length"
    )
    before = context.held_out(context.load_model(), tokenizer) if config.evaluate_before_after else None
    # Multi-turn episodes are played by a rollout_func (TRL then masks the tool turns out of the loss).
    rollout = (
        EpisodeRollout(context.pool, tokenizer, config)
        if any(context.pool.uses_episodes(f) for f in config.pool.families)
        else None
    )

    def make_trainer(callbacks: list[Any], replay: int) -> Any:
        dataset = IterableDataset.from_generator(
            prompt_stream, gen_kwargs={"context": context, "seed": train.seed, "rollout": rollout}
        )
        args = GRPOConfig(
            **{
                **context.trainer_args(replay),
                "per_device_train_batch_size": train.batch_size * config.num_generations,
            },
            num_generations=config.num_generations,
            max_completion_length=config.max_completion_length,
            temperature=config.temperature,
            top_k=config.top_k or 0,
            beta=config.beta,
            shuffle_dataset=False,
            ignore_data_skip=True,
            disable_dropout=True,
        )
        extra = {"rollout_func": rollout} if rollout is not None else {}
        return context.trl_trainer(
            GRPOTrainer, args, tokenizer, callbacks, reward_funcs=[reward], train_dataset=dataset, **extra
        )

    def held_out(model: Any) -> float:
        return context.held_out(model, tokenizer).overall

    def restore(pool: dict[str, Any]) -> None:
        context.pool.state = PoolState.model_validate(pool)

    trainer, guarded = context.train(
        make_trainer,
        resume,
        state_hooks=(lambda: context.pool.state.model_dump(), restore),
        held_out=held_out,
        extra_callbacks=extra_callbacks,
    )
    after = context.held_out(trainer.model, tokenizer) if config.evaluate_before_after else None
    rewards = [row["reward"] for row in guarded.history if "reward" in row]
    metrics = {
        "steps": guarded.steps,
        "rollbacks": guarded.rollbacks,
        "entropy_alerts": guarded.entropy_alerts,
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "groups_kept": context.pool.state.kept_groups,
        "groups_dropped": context.pool.state.dropped_groups,
        "tiers": dict(context.pool.state.tiers),
        "rollouts_traced": context.trace.count,
        **before_after(before, after),
    }
    return context.finish(trainer, tokenizer, guarded.history, metrics)
