"""Stability and reward-hacking guards, and the driver that trains with them.

- :class:`SpikeDetector`: a loss or grad norm far above its running median is a spike.
- :class:`RewardHackingCanary`: training reward rising while held-out pass rate falls, ``patience`` times
  in a row, stops the run.
- Entropy below a floor raises a logged alert (collapse of exploration).
- :func:`train_guarded` runs a trainer factory; on a spike it rolls back to the last good checkpoint
  (verified) and continues, at most ``max_rollbacks`` times; it resumes interrupted runs. SIGTERM or
  SIGINT stops it at the end of the current step with a checkpoint saved, and the time budget is the
  run's total training time across resumes (each checkpoint records the seconds spent).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from transformers import TrainerCallback

from posttrain.checkpoints import RunState, discard_after, latest_checkpoint, load_checkpoint, seal_checkpoint
from posttrain.config import GuardConfig
from posttrain.errors import RewardHackingDetected, TrainingDiverged, TrainingInterrupted
from posttrain.trace import TraceWriter

log = logging.getLogger(__name__)


class SpikeDetector(BaseModel):
    """Running windows of loss and grad norm; :meth:`observe` says whether a step spiked."""

    factor: float
    floor: float = 1.0
    window: int
    min_history: int
    series: dict[str, list[float]] = Field(default_factory=dict)

    def observe(self, values: dict[str, float]) -> list[str]:
        spiked = []
        for name, value in values.items():
            past = self.series.setdefault(name, [])
            if len(past) >= self.min_history:
                median = statistics.median(past[-self.window :])
                if value != value or abs(value) > self.factor * max(abs(median), self.floor):
                    spiked.append(f"{name}={value:.4g} vs median {median:.4g}")
            if not spiked:
                past.append(value)
        return spiked


class RewardHackingCanary(BaseModel):
    patience: int
    last_reward: float | None = None
    last_held_out: float | None = None
    strikes: int = 0

    def observe(self, reward: float, held_out: float) -> bool:
        """True once reward rose and held-out fell ``patience`` consecutive checks."""
        if self.last_reward is not None and self.last_held_out is not None:
            bad = reward > self.last_reward and held_out < self.last_held_out
            self.strikes = self.strikes + 1 if bad else 0
        self.last_reward, self.last_held_out = reward, held_out
        return self.strikes >= self.patience


class GuardState(BaseModel):
    spikes: SpikeDetector
    canary: RewardHackingCanary
    rollbacks: int = 0
    entropy_alerts: int = 0


class GuardCallback(TrainerCallback):
    """Watches logged metrics; stops training on a spike or a canary; seals checkpoints with run state."""

    def __init__(
        self,
        config: GuardConfig,
        state: GuardState,
        run_state: Callable[[int, GuardCallback], RunState],
        trace: TraceWriter,
        stage: str,
        held_out: Callable[[Any], float] | None = None,
        prior_history: list[dict[str, float]] | None = None,
    ) -> None:
        self.config = config
        self.prior_history = list(prior_history or [])
        self.state = state
        self.run_state = run_state
        self.trace = trace
        self.stage = stage
        self.held_out = held_out
        self.spike_step: int | None = None
        self.canary_fired = False
        self.history: list[dict[str, float]] = []
        self._reward_window: list[float] = []

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        if not logs or "loss" not in logs:
            return
        step = int(state.global_step)
        row = {"step": float(step), **{k: float(v) for k, v in logs.items() if isinstance(v, int | float)}}
        self.history.append(row)
        watched: dict[str, float] = {k: float(logs[k]) for k in ("loss", "grad_norm") if k in logs}
        spiked = self.state.spikes.observe(watched)
        if spiked:
            self.spike_step = step
            control.should_training_stop = True
            control.should_save = False
            self.trace.event(self.stage, step, type="spike", detail=spiked)
            log.warning("event=spike step=%d detail=%s action=rollback", step, spiked)
        entropy = logs.get("entropy")
        if entropy is not None and entropy < self.config.entropy_floor:
            self.state.entropy_alerts += 1
            self.trace.event(self.stage, step, type="entropy_floor", entropy=float(entropy))
            log.warning(
                "event=entropy_floor step=%d entropy=%.4f floor=%.4f",
                step,
                entropy,
                self.config.entropy_floor,
            )
        if "reward" in logs:
            self._reward_window.append(float(logs["reward"]))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        every = self.config.canary_every
        if self.held_out is None or not every or state.global_step % every or not self._reward_window:
            return
        reward = sum(self._reward_window) / len(self._reward_window)
        self._reward_window = []
        held_out = self.held_out(kwargs["model"])
        self.history.append({"step": float(state.global_step), "held_out_pass_rate": held_out})
        self.trace.event(self.stage, state.global_step, type="canary", reward=reward, held_out=held_out)
        if self.state.canary.observe(reward, held_out):
            self.canary_fired = True
            control.should_training_stop = True
            log.error(
                "event=reward_hacking_canary step=%d reward=%.3f held_out=%.3f",
                state.global_step,
                reward,
                held_out,
            )

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        directory = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if directory.is_dir():
            seal_checkpoint(directory, self.run_state(int(state.global_step), self))


class TrainingClock:
    """Training seconds of a run: what earlier processes spent (read from the checkpoint) plus this one's."""

    def __init__(self, spent_before: float = 0.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.spent_before = spent_before
        self._clock = clock
        self._started = clock()

    def spent(self) -> float:
        return self.spent_before + self._clock() - self._started


class TimeBudgetCallback(TrainerCallback):
    """Stops training (with a final save) once the run's training time reaches the budget."""

    def __init__(self, budget_s: float, clock: TrainingClock) -> None:
        self.budget_s = budget_s
        self.clock = clock

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.clock.spent() > self.budget_s:
            log.info("event=time_budget_spent step=%d spent_s=%.0f", state.global_step, self.clock.spent())
            control.should_training_stop = True
            control.should_save = True


class StopOnSignal(TrainerCallback):
    """Turns SIGTERM / SIGINT into a stop at the end of the current step, with a checkpoint saved.

    A second signal restores the previous handler's behaviour (a stuck step can still be killed).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopOnSignal]:
        """Handle the signals while the block runs (only in the main thread, where Python allows it)."""
        try:
            for number in self.SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        except ValueError:  # not the main thread: leave the default behaviour
            self._previous.clear()
        try:
            yield self
        finally:
            for number, handler in self._previous.items():
                signal.signal(number, handler)
            self._previous.clear()

    def _handle(self, number: int, frame: Any) -> None:
        received = signal.Signals(number)
        if self.received is not None:
            signal.signal(number, self._previous.get(received, signal.SIG_DFL))
            signal.raise_signal(number)
            return
        self.received = received
        log.warning("event=stop_requested signal=%s action=save_and_stop_after_this_step", received.name)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.received is not None:
            control.should_training_stop = True
            control.should_save = True


def new_guard_state(config: GuardConfig) -> GuardState:
    return GuardState(
        spikes=SpikeDetector(
            factor=config.spike_factor,
            floor=config.spike_floor,
            window=config.spike_window,
            min_history=config.spike_min_history,
        ),
        canary=RewardHackingCanary(patience=config.canary_patience),
    )


class GuardedResult(BaseModel):
    steps: int
    rollbacks: int
    entropy_alerts: int
    resumed_from: str | None
    history: list[dict[str, float]]


def train_guarded(
    make_trainer: Callable[[list[TrainerCallback], int], Any],
    run_dir: Path,
    digest: str,
    config: GuardConfig,
    trace: TraceWriter,
    stage: str,
    *,
    state_hooks: tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None]] | None = None,
    held_out: Callable[[Any], float] | None = None,
    extra_callbacks: list[TrainerCallback] | None = None,
    resume: bool = True,
    time_budget_s: float | None = None,
) -> tuple[Any, GuardedResult]:
    """Train to the end under the guards; returns the final trainer and what happened.

    ``make_trainer(callbacks, replay)`` must build a fresh trainer (model loaded from the base) each call,
    writing checkpoints under ``run_dir``; ``replay`` is the number of rollbacks so far, for
    ``StageContext.trainer_args(replay)`` (a new data order after a rollback). ``state_hooks`` = (export, restore) of extra state (the task pool).
    """
    guard_state = new_guard_state(config)

    clock = TrainingClock()

    def run_state(step: int, guard: GuardCallback) -> RunState:
        return RunState(
            config_digest=digest,
            step=step,
            train_seconds=clock.spent(),
            pool=state_hooks[0]() if state_hooks else {},
            guards=guard.state.model_dump(),
            trace_records=trace.count,
            history=guard.prior_history + guard.history,
        )

    history: list[dict[str, float]] = []
    checkpoint = latest_checkpoint(run_dir, digest) if resume else None
    resumed_from = str(checkpoint) if checkpoint else None
    first_pass = True
    while True:
        if checkpoint is not None:
            saved = load_checkpoint(checkpoint, digest)
            rollbacks = guard_state.rollbacks
            guard_state = GuardState.model_validate(saved.guards)
            guard_state.rollbacks = max(rollbacks, guard_state.rollbacks)
            history = list(saved.history)
            if state_hooks:
                state_hooks[1](saved.pool)
            if first_pass:
                # Resuming a stopped run: its budget keeps counting from what it had spent at that checkpoint
                # (after a rollback in this process the clock just runs on).
                clock = TrainingClock(saved.train_seconds)
            log.info("event=resume checkpoint=%s step=%d spent_s=%.0f", checkpoint, saved.step, clock.spent())
        first_pass = False

        guard = GuardCallback(config, guard_state, run_state, trace, stage, held_out, prior_history=history)
        budget = [TimeBudgetCallback(time_budget_s, clock)] if time_budget_s else []
        stop = StopOnSignal()
        trainer = make_trainer([*(extra_callbacks or []), guard, *budget, stop], guard_state.rollbacks)
        with stop.installed():
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        history = history + guard.history
        if stop.received is not None:
            step = int(trainer.state.global_step)
            raise TrainingInterrupted(
                f"{stage}: stopped by {stop.received.name} at step {step} with checkpoint-{step} saved in "
                f"{run_dir}; run the same command again to resume from it"
            )
        if guard.canary_fired:
            trace.seal()
            raise RewardHackingDetected(
                f"{stage}: training reward rose while held-out pass rate fell {config.canary_patience} checks "
                f"in a row (stopped at step {trainer.state.global_step}; trace kept in {run_dir})"
            )
        if guard.spike_step is None:
            return trainer, GuardedResult(
                steps=int(trainer.state.global_step),
                rollbacks=guard_state.rollbacks,
                entropy_alerts=guard_state.entropy_alerts,
                resumed_from=resumed_from,
                history=history,
            )
        guard_state.rollbacks += 1
        if guard_state.rollbacks > config.max_rollbacks:
            trace.seal()
            raise TrainingDiverged(
                f"{stage}: spike at step {guard.spike_step} after {config.max_rollbacks} rollbacks; giving up"
            )
        checkpoint = latest_checkpoint(run_dir, digest, before_step=guard.spike_step)
        discard_after(run_dir, int(checkpoint.name.split("-")[1]) if checkpoint else 0)
        trace.event(
            stage,
            guard.spike_step,
            type="rollback",
            to=checkpoint.name if checkpoint else "base",
            rollbacks=guard_state.rollbacks,
        )
        log.warning("event=rollback from_step=%d to=%s", guard.spike_step, checkpoint or "base")
