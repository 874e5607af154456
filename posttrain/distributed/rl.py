"""GRPO on Ray: the driver. It owns the task pool, the trace and the checkpoints; vLLM engines sample the groups,
the scheduler runs rollout and verification jobs, and a Ray Train ``TorchTrainer`` learns.

Each step the driver draws ``batch_size`` prompts, has the engines sample ``num_generations`` completions per
prompt (every completion carries the policy version that made it), scores them with the eval suite's
verifiers, turns rewards into group-normalised advantages and puts one shard per learner rank into the
:class:`~posttrain.distributed.learner.StepChannel`. Sampling for step n may start once the engines hold
policy version >= n - ``max_staleness`` (0: synchronous), so with staleness 1 the engines sample step n+1 while
the learner trains on step n; the learner's truncated importance weights correct the lag.

A checkpoint is the learner's weights and optimizer state (written by rank 0) plus the driver's own state
(pool, trace position, history, guards), sealed with a sha256 manifest: one directory, resumable after a
crash of any process. A loss or grad-norm spike rolls the whole run back to the checkpoint before it.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from evalsuite.generators.base import derive_seed
from evalsuite.schema import TaskInstance, VerifierResult
from infra.lifecycle import init_ray
from posttrain.checkpoints import RunState, discard_after, latest_checkpoint, load_checkpoint, seal_checkpoint
from posttrain.common import StageContext, before_after
from posttrain.distributed.config import RayConfig
from posttrain.distributed.learner import OPTIMIZER_NAME, LearnerSpec, StepChannel, learner_loop
from posttrain.distributed.scheduler import Job, Scheduler
from posttrain.distributed.verdicts import scheduled_verdicts
from posttrain.episodes import require_room_for_turns
from posttrain.errors import PosttrainError, RewardHackingDetected, TrainingDiverged
from posttrain.formats import format_for
from posttrain.guards import GuardState, TrainingClock, new_guard_state
from posttrain.pool import PoolState
from posttrain.rewards import VerifierReward
from posttrain.run import CandidateResult
from posttrain.stages import RLRunConfig

log = logging.getLogger(__name__)

Progress = Callable[[dict[str, Any]], None]


def connect(config: RayConfig) -> None:
    """Join the configured cluster (or RAY_ADDRESS), else start a local Ray sized for engines + learners."""
    import ray

    if ray.is_initialized():
        return
    address = config.address or os.environ.get("RAY_ADDRESS")
    if address:
        init_ray(address=address, log_to_driver=False, configure_logging=False)
    else:
        cpus = config.num_cpus or max(8, os.cpu_count() or 1)
        init_ray(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    log.info("event=ray_connected address=%s resources=%s", address or "local", ray.cluster_resources())


def tier_pass_rates(instances: list[TaskInstance], correct: list[bool]) -> dict[str, float]:
    """The step's rollouts' pass rate per difficulty tier, as ``pass_rate_<tier>`` (tiers the step sampled)."""
    by_tier: dict[str, list[bool]] = {}
    for instance, ok in zip(instances, correct, strict=True):
        by_tier.setdefault(instance.difficulty, []).append(ok)
    return {f"pass_rate_{tier}": sum(oks) / len(oks) for tier, oks in sorted(by_tier.items())}


def group_advantages(rewards: list[float], group: int) -> list[float]:
    """GRPO advantages as TRL computes them: (r - group mean) / (group std + 1e-4), std with Bessel's correction."""
    out: list[float] = []
    for start in range(0, len(rewards), group):
        chunk = rewards[start : start + group]
        mean = statistics.fmean(chunk)
        std = statistics.stdev(chunk) if len(chunk) > 1 else 0.0
        out += [(r - mean) / (std + 1e-4) for r in chunk]
    return out


class RayGRPO:
    """One GRPO run on Ray (see the module docstring); :meth:`run` returns the published candidate."""

    def __init__(
        self,
        config: RLRunConfig,
        instances: list[TaskInstance] | None = None,
        on_progress: Progress | None = None,
    ) -> None:
        if config.ray is None:
            raise PosttrainError("RayGRPO needs `ray:` in the run config")
        self.config = config
        self.ray_config: RayConfig = config.ray
        workers = self.ray_config.learner.workers
        rollouts = config.train.batch_size * config.num_generations
        if rollouts % workers:
            raise PosttrainError(
                f"train.batch_size x num_generations = {rollouts} rollouts per step do not split evenly over "
                f"{workers} learner workers; pick a batch size that does"
            )
        self.context = StageContext(config, "rl", instances)
        self.tokenizer = self.context.load_tokenizer()
        require_room_for_turns(
            [i for i in self.context.pool.instances.values() if self.context.pool.uses_episodes(i.family)],
            self.tokenizer,
            config.episodes.tool_call_parser,
            *self._episode_budget(),
        )
        self.on_progress = on_progress or (lambda _: None)
        self.sampling = {
            "n": config.num_generations,
            "temperature": config.temperature,
            "top_p": 1.0,
            "top_k": config.top_k,
            "max_tokens": config.max_completion_length,
        }
        self.reward = VerifierReward(
            self.context.pool,
            config.reward,
            self.context.trace,
            {
                **{k: v for k, v in self.sampling.items() if k != "n"},
                "max_completion_length": config.max_completion_length,
                "num_generations": config.num_generations,
            },
            config.num_generations,
            config.max_completion_length,
        )
        self.history: list[dict[str, float]] = []
        self.guards = new_guard_state(config.guards)
        self.batches: dict[int, dict[str, float]] = {}
        self._batch: dict[str, float] = {}
        self.engines: dict[str, Any] = {}
        self.engine_version = 0
        self.scheduler = Scheduler(self.ray_config.scheduler, on_event=self._scheduler_event)
        self.weights_dir = _weights_dir(self.context.run_dir)
        self.quarantined = 0
        self.replay = 0
        self.clock = TrainingClock()
        self.final_step: int | None = None  # set once the time budget is spent

    # ------------------------------------------------------------------ events
    def _scheduler_event(self, event: dict[str, Any]) -> None:
        if event.get("type") in ("job_quarantined", "engine_left", "job_retry"):
            self.context.trace.event("rl", self.engine_version, **event)
        if event.get("type") == "job_quarantined":
            self.quarantined += 1

    # ------------------------------------------------------------------ engines
    def _start_engines(self, model_dir: Path) -> None:
        from posttrain.distributed.engines import start_engines

        self.engines = start_engines(model_dir, self.ray_config.engine, self.ray_config.engines)
        for name, handle in self.engines.items():
            self.scheduler.join(name, handle, capacity=self.ray_config.engine.capacity)

    def _push(self, path: str, version: int) -> None:
        """Every engine loads ``path`` in memory and samples as policy ``version`` from now on."""
        import ray

        started = time.monotonic()
        ray.get([handle.load_weights.remote(path, version) for handle in self.engines.values()])
        self.engine_version = version
        for old in self.weights_dir.glob("policy-*.safetensors"):  # the learner's older versions, now unused
            if int(old.stem.split("-")[1]) < version:
                old.unlink(missing_ok=True)
        log.info(
            "event=weights_pushed version=%d engines=%d seconds=%.2f",
            version,
            len(self.engines),
            time.monotonic() - started,
        )

    # ------------------------------------------------------------------ sampling
    def _prompt_ids(self, instance: TaskInstance) -> tuple[list[dict[str, str]], list[int]]:
        if self.context.pool.uses_episodes(instance.family):
            return [], []  # an episode's prompt carries its tools; it is rendered where the episode is played
        messages = format_for(instance.family).messages(instance)
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return messages, list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def produce(self, step: int) -> list[dict[str, Any]] | None:
        """Sample, verify and score step ``step``'s groups; the learner shards (None: every group failed)."""

        pool, config = self.context.pool, self.config
        window, setting = self._episode_budget()
        prompt_ids: dict[str, tuple[list[dict[str, str]], list[int]]] = {}

        def prompt_tokens(instance: TaskInstance) -> int:
            prompt_ids[instance.instance_id] = self._prompt_ids(instance)
            return len(prompt_ids[instance.instance_id][1])

        drawn = pool.draw_fitting(
            config.train.batch_size,
            lambda draw: _rng(config.train.seed, draw, self.replay),
            prompt_tokens,
            window - config.max_completion_length,
            setting,
        )
        prompts = [prompt_ids[instance.instance_id] for instance in drawn]
        jobs = [
            self._rollout_job(
                f"rollout:{step}:{index}",
                instance,
                ids,
                derive_seed("rl-sample", config.train.seed, step, index, self.replay),
            )
            for index, (instance, (_, ids)) in enumerate(zip(drawn, prompts, strict=True))
        ]
        results, failures = self.scheduler.run(jobs)
        for failure in failures:
            self.context.trace.event(
                "rl",
                self.engine_version,
                type="group_lost",
                step=step,
                key=failure.key,
                errors=failure.errors,
            )
        groups = [
            (instance, messages, ids, results[job.key][0])
            for job, instance, (messages, ids) in zip(jobs, drawn, prompts, strict=True)
            if job.key in results
        ]
        if not groups:
            return None
        # An episode (multi-turn) completion carries its own prompt, text, loss mask and verdict.
        flat = [
            (instance, c.get("prompt", messages), c.get("prompt_ids", ids), c)
            for instance, messages, ids, completions in groups
            for c in completions
        ]
        texts = [
            c["text"] if "text" in c else self.tokenizer.decode(c["token_ids"], skip_special_tokens=True)
            for _, _, _, c in flat
        ]
        instances = [instance for instance, _, _, _ in flat]
        verdicts = self._verify(step, instances, texts, [c.get("verdict") for _, _, _, c in flat])
        rewards = self.reward.grade(
            [messages for _, messages, _, _ in flat],
            texts,
            [instance.instance_id for instance in instances],
            [sum(c.get("loss_mask") or [1] * len(c["token_ids"])) for _, _, _, c in flat],
            [int(c["policy_version"]) for _, _, _, c in flat],
            verdicts,
            ["verdict" in c for _, _, _, c in flat],
        )
        advantages = group_advantages(rewards, config.num_generations)
        sequences = [
            {"prompt_ids": ids, "completion_ids": c["token_ids"], "logprobs": c["logprobs"], "advantage": a}
            | ({"loss_mask": c["loss_mask"]} if "loss_mask" in c else {})
            for (_, _, ids, c), a in zip(flat, advantages, strict=True)
            if c["token_ids"]
        ]
        workers = self.ray_config.learner.workers
        if len(sequences) < workers:
            return None
        sequences = sequences[: len(sequences) - len(sequences) % workers]  # equal shards keep DDP in step
        tokens = sum(sum(s.get("loss_mask") or [1] * len(s["completion_ids"])) for s in sequences)
        versions = [int(c["policy_version"]) for _, _, _, c in flat]
        self._batch = {
            "reward": statistics.fmean(rewards),
            "staleness": float(step - min(versions)),
            "groups": float(len(groups)),
            "completion_tokens": float(tokens),
        } | tier_pass_rates(instances, [result.correct for result, _ in verdicts])
        return [{"sequences": sequences[rank::workers], "global_tokens": tokens} for rank in range(workers)]

    def _rollout_job(self, key: str, instance: TaskInstance, prompt_ids: list[int], seed: int) -> Job:
        """One group's job: ``num_generations`` completions of a prompt, or episodes of an episode family."""
        config = self.config
        if not self.context.pool.uses_episodes(instance.family):
            return Job(
                key=key,
                domain=instance.family,
                kind="rollout",
                launch=partial(_launch_generate, prompt_ids=prompt_ids, sampling=self.sampling, seed=seed),
            )
        from posttrain.distributed.episodes import episode_job

        return episode_job(
            key,
            instance,
            tokenizer_dir=str(self.context.base_dir),
            sampling=self.sampling,
            episodes=config.episodes.model_dump(mode="json"),
            max_turn_tokens=config.max_completion_length,
            max_total_tokens=self._episode_budget()[0],
            group=config.num_generations,
            seed=seed,
        )

    def _episode_budget(self) -> tuple[int, str]:
        """Tokens one episode may span, and the setting that bounds them (the engines' context may be smaller)."""
        length, window = self.config.train.max_length, self.ray_config.engine.engine.max_model_len
        if window and window < length:
            return window, "ray.engine.engine.max_model_len"
        return length, "train.max_length"

    def _verify(
        self,
        step: int,
        instances: list[TaskInstance],
        texts: list[str],
        known: list[dict[str, Any] | None],
    ) -> list[tuple[VerifierResult, float]]:
        return scheduled_verdicts(self.scheduler, self.config.reward.verify, step, instances, texts, known)

    # ------------------------------------------------------------------ learner
    def _learner(
        self, start_step: int, start_dir: Path, optimizer_state: Path | None
    ) -> tuple[Any, threading.Thread, list[BaseException]]:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        config, learner = self.config, self.ray_config.learner
        channel = ray.remote(num_cpus=0)(StepChannel).options(max_concurrency=64).remote(learner.workers)
        spec = LearnerSpec(
            start_dir=str(start_dir),
            reference_dir=str(self.context.base_dir),
            start_step=start_step,
            max_steps=config.train.max_steps,
            optimizer_state=str(optimizer_state) if optimizer_state else None,
            learning_rate=config.train.learning_rate,
            max_grad_norm=config.guards.max_grad_norm,
            temperature=config.temperature,
            top_k=config.top_k,
            beta=config.beta,
            dtype=config.train.resolved_dtype(),
            seed=config.train.seed + 1000 * self.replay,
            save_steps=config.train.save_steps,
            run_dir=str(self.context.run_dir),
            weights_dir=str(self.weights_dir),
            learner=learner,
        )
        trainer = TorchTrainer(
            learner_loop,
            train_loop_config={"spec": spec.model_dump(mode="json"), "channel": channel},
            scaling_config=ScalingConfig(
                num_workers=learner.workers,
                use_gpu=config.train.resolved_device() == "cuda",
                resources_per_worker={"CPU": learner.cpus_per_worker},
            ),
            run_config=RunConfig(
                name=f"learner-{start_step}-{self.replay}-{int(time.time())}",
                storage_path=str((self.context.run_dir / "ray-train").resolve()),
                failure_config=FailureConfig(max_failures=0),
            ),
        )
        errors: list[BaseException] = []

        def fit() -> None:
            try:
                trainer.fit()
            except BaseException as exc:  # reported by the driver's loop
                errors.append(exc)

        thread = threading.Thread(target=fit, name="tandem-learner", daemon=True)
        thread.start()
        return channel, thread, errors

    def _canary(self, version: int, weights: str, reward: float) -> None:
        """Every ``canary_every`` steps: held-out pass rate of the new policy; reward up while held-out falls
        ``canary_patience`` checks in a row stops the run (reward hacking)."""
        every = self.config.guards.canary_every
        if not every or version % every:
            return
        from safetensors.torch import load_file

        model = self.context.load_model()
        model.load_state_dict(load_file(weights), strict=False)
        held_out = self.context.held_out(model, self.tokenizer).overall
        self.context.trace.event("rl", version, type="canary", reward=reward, held_out=held_out)
        if self.guards.canary.observe(reward, held_out):
            self.context.trace.seal()
            raise RewardHackingDetected(
                f"rl: training reward rose while held-out pass rate fell {self.config.guards.canary_patience} "
                f"checks in a row (stopped at step {version}; trace kept in {self.context.run_dir})"
            )

    # ------------------------------------------------------------------ the run
    def _seal(self, version: int, checkpoint: Path, snapshot: tuple[dict[str, Any], int]) -> None:
        self.tokenizer.save_pretrained(checkpoint)
        pool_state, trace_records = snapshot
        seal_checkpoint(
            checkpoint,
            RunState(
                config_digest=self.context.digest,
                step=version,
                pool=pool_state,
                guards=self.guards.model_dump(),
                trace_records=trace_records,
                history=self.history[:version],
                train_seconds=self.clock.spent(),
            ),
        )
        log.info("event=checkpoint_sealed step=%d path=%s", version, checkpoint)

    def _segment(self, start_step: int, start_dir: Path, optimizer_state: Path | None) -> int | None:
        """Train from ``start_step`` to the end; the step of a spike (None: finished)."""
        import ray

        channel, thread, errors = self._learner(start_step, start_dir, optimizer_state)
        max_steps, staleness = self.config.train.max_steps, self.ray_config.max_staleness
        budget = self.config.train.time_budget_s
        produced, version = start_step, start_step
        snapshots: dict[int, tuple[dict[str, Any], int]] = {}
        pending: dict[str, Any] = {}
        try:
            while version < (self.final_step or max_steps):
                if pending and version > self.engine_version:
                    self._push(pending["weights"], version)
                while (
                    produced < (self.final_step or max_steps) and produced - self.engine_version <= staleness
                ):
                    snapshots[produced] = (self.context.pool.state.model_dump(), self.context.trace.count)
                    shards = self.produce(produced)
                    if shards is None:
                        raise PosttrainError(
                            f"step {produced}: every rollout group failed (see the trace's group_lost events)"
                        )
                    if budget is not None and self.final_step is None and self.clock.spent() > budget:
                        # The learner ends (with a checkpoint) after this step; nothing is sampled past it.
                        self.final_step = produced + 1
                        shards = [shard | {"final": True} for shard in shards]
                        log.info(
                            "event=time_budget_spent step=%d spent_s=%.0f", produced + 1, self.clock.spent()
                        )
                        self.context.trace.event("rl", produced + 1, type="time_budget_spent")
                    ray.get(channel.put.remote(produced, shards))
                    self.batches[produced] = dict(self._batch)
                    produced += 1
                waited = time.monotonic()
                published: list[tuple[int, dict[str, Any]]] = []
                while not published:
                    if errors or not thread.is_alive():
                        raise PosttrainError(
                            f"the learner stopped at step {version}: {errors[0] if errors else 'no error reported'}"
                        )
                    if time.monotonic() - waited > self.ray_config.step_timeout_s:
                        raise PosttrainError(
                            f"no learner step in {self.ray_config.step_timeout_s:g}s at step {version}"
                        )
                    published = ray.get(channel.wait_published.remote(version, 5.0))
                for new_version, info in sorted(published, key=lambda item: item[0]):
                    if new_version <= version:
                        continue
                    version = new_version
                    stats = {
                        **info["stats"],
                        **self.batches.get(version - 1, {}),
                        "step": float(version),
                        "engine_version": float(self.engine_version),
                    }
                    self.history.append(stats)
                    self.context.trace.event("rl", version, type="learner_step", **stats)
                    self.on_progress(
                        stats
                        | {
                            "max_steps": max_steps,
                            "engines": len(self.engines),
                            "health": self.scheduler.health(),
                        }
                    )
                    spikes = self.guards.spikes.observe(
                        {"loss": stats["loss"], "grad_norm": stats["grad_norm"]}
                    )
                    if spikes:
                        self.context.trace.event("rl", version, type="spike", detail=spikes)
                        log.warning("event=spike step=%d detail=%s", version, "; ".join(spikes))
                        return version
                    self._canary(version, info["weights"], stats["reward"])
                    if stats["entropy"] < self.config.guards.entropy_floor:
                        self.guards.entropy_alerts += 1
                        self.context.trace.event(
                            "rl", version, type="entropy_alert", entropy=stats["entropy"]
                        )
                    if info.get("checkpoint"):
                        self._seal(
                            version,
                            Path(info["checkpoint"]),
                            snapshots.get(
                                version, (self.context.pool.state.model_dump(), self.context.trace.count)
                            ),
                        )
                    pending = info
            return None
        finally:
            ray.get(channel.close.remote())
            thread.join(timeout=120)

    def run(self, resume: bool = True) -> CandidateResult:
        config, context = self.config, self.context
        before = (
            context.held_out(context.load_model(), self.tokenizer) if config.evaluate_before_after else None
        )
        checkpoint = latest_checkpoint(context.run_dir, context.digest) if resume else None
        start_step, start_dir, optimizer_state = 0, context.base_dir, None
        if checkpoint is not None:
            saved = load_checkpoint(checkpoint, context.digest)
            start_step, start_dir, optimizer_state = saved.step, checkpoint, checkpoint / OPTIMIZER_NAME
            context.pool.state = PoolState.model_validate(saved.pool)
            self.guards = GuardState.model_validate(saved.guards)
            self.history = list(saved.history)
            context.trace.truncate(saved.trace_records)
            self.clock = TrainingClock(saved.train_seconds)  # the budget counts across resumes
            log.info(
                "event=resume checkpoint=%s step=%d spent_s=%.0f", checkpoint, saved.step, self.clock.spent()
            )
        self.engine_version = start_step
        self._start_engines(start_dir)
        try:
            while True:
                spike = self._segment(start_step, start_dir, optimizer_state)
                if spike is None:
                    break
                self.guards.rollbacks += 1
                if self.guards.rollbacks > config.guards.max_rollbacks:
                    context.trace.seal()
                    raise TrainingDiverged(
                        f"rl: spike at step {spike} after {config.guards.max_rollbacks} rollbacks; giving up"
                    )
                back = latest_checkpoint(context.run_dir, context.digest, before_step=spike)
                discard_after(context.run_dir, int(back.name.split("-")[1]) if back else 0)
                self.replay += 1
                if back is None:
                    start_step, start_dir, optimizer_state = 0, context.base_dir, None
                    context.pool.state = PoolState(
                        tiers={f: config.pool.start_tier for f in config.pool.families}
                    )
                else:
                    saved = load_checkpoint(back, context.digest)
                    start_step, start_dir, optimizer_state = saved.step, back, back / OPTIMIZER_NAME
                    context.pool.state = PoolState.model_validate(saved.pool)
                self.history = self.history[:start_step]
                self._push(str(start_dir / "model.safetensors"), start_step)
                context.trace.event(
                    "rl", spike, type="rollback", to=start_dir.name, rollbacks=self.guards.rollbacks
                )
        finally:
            self._stop_engines()
        final = context.run_dir / f"checkpoint-{self.final_step or config.train.max_steps}"
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(final)
        after = context.held_out(model, self.tokenizer) if config.evaluate_before_after else None
        rewards = [row["reward"] for row in self.history if "reward" in row]
        metrics = {
            "runtime": "ray",
            "engines": self.ray_config.engines,
            "learners": self.ray_config.learner.workers,
            "max_staleness": self.ray_config.max_staleness,
            "steps": len(self.history),
            "rollbacks": self.guards.rollbacks,
            "entropy_alerts": self.guards.entropy_alerts,
            "reward_first": rewards[0] if rewards else None,
            "reward_last": rewards[-1] if rewards else None,
            "groups_kept": context.pool.state.kept_groups,
            "groups_dropped": context.pool.state.dropped_groups,
            "prompts_too_long": context.pool.state.too_long,
            "jobs_quarantined": self.quarantined,
            "tiers": dict(context.pool.state.tiers),
            "rollouts_traced": context.trace.count,
            "train_seconds": round(self.clock.spent(), 1),
            "time_budget_spent": self.final_step is not None,
            **before_after(before, after),
        }
        shutil.rmtree(self.weights_dir, ignore_errors=True)
        return context.finish(SimpleNamespace(model=model), self.tokenizer, self.history, metrics)

    def _stop_engines(self) -> None:
        import ray

        for name in self.engines:
            self.scheduler.leave(name)
        try:  # a clean engine shutdown also ends vLLM's engine-core process
            ray.get([handle.shutdown.remote() for handle in self.engines.values()], timeout=60)
        except Exception as error:  # a dead or hung engine: killing its actor is all that is left
            log.warning("event=engine_shutdown_failed error=%s", error)
        for handle in self.engines.values():
            ray.kill(handle)
        self.engines = {}


def _rng(seed: int, draw: int, replay: int) -> Any:
    import random

    return random.Random(derive_seed("rl", seed, draw, replay))


def _launch_generate(handle: Any, *, prompt_ids: list[int], sampling: dict[str, Any], seed: int) -> Any:
    return handle.generate.remote([prompt_ids], sampling, seed)


def _weights_dir(run_dir: Path) -> Path:
    """Where rank 0 writes each policy version for the engines: shared memory when the machine has it (the
    engines read it at memory speed), else the run directory."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else run_dir
    import hashlib

    path = base / f"tandem-policy-{hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def posttrain_rl_ray(
    config: RLRunConfig,
    resume: bool = True,
    instances: list[TaskInstance] | None = None,
    on_progress: Progress | None = None,
) -> CandidateResult:
    """GRPO from ``config.base`` on Ray (engines, scheduler, Ray Train learner); publishes the candidate."""
    if config.ray is None:
        raise PosttrainError("posttrain_rl_ray needs `ray:` in the run config")
    connect(config.ray)
    return RayGRPO(config, instances, on_progress).run(resume)
