"""The task pool: train-split instances per family, per-family quotas, pass-rate grading, DAPO-style
dynamic sampling and difficulty tiers that move up as the pass rate rises.

The pool is the only place that holds instances with their answers; trainers see instance ids and the
policy-visible messages. Its state (grades and tiers) is a pydantic model saved with every checkpoint.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator

from pydantic import BaseModel, Field

from evalsuite.generators import generate_instances
from evalsuite.schema import DIFFICULTIES, Difficulty, Family, TaskInstance
from posttrain.config import TaskPoolConfig
from posttrain.episodes import uses_episodes
from posttrain.errors import PosttrainError
from posttrain.formats import format_for

log = logging.getLogger(__name__)


class Grade(BaseModel):
    """Measured outcomes of one prompt's rollouts."""

    attempts: int = 0
    correct: int = 0
    last_group: list[bool] = Field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        return self.correct / self.attempts if self.attempts else 0.0

    @property
    def degenerate(self) -> bool:
        """The last group was all correct or all wrong, so it carried no GRPO signal."""
        return len(self.last_group) > 1 and len(set(self.last_group)) == 1


class PoolState(BaseModel):
    grades: dict[str, Grade] = Field(default_factory=dict)
    tiers: dict[str, Difficulty] = Field(default_factory=dict)
    dropped_groups: int = 0
    kept_groups: int = 0
    draws: int = 0
    too_long: int = Field(0, description="Draws left out because the prompt did not fit the token budget.")


class TaskPool:
    """Train-split instances with a curriculum over them."""

    def __init__(self, config: TaskPoolConfig, instances: list[TaskInstance] | None = None) -> None:
        """Generate the train pool, or take ``instances`` as given (custom task sets, tests)."""
        self.config = config
        for family in config.families:
            if not uses_episodes(family, config.rollout):
                format_for(family)
        if instances is None:
            instances = [
                made
                for family in config.families
                for made in generate_instances(family, "train", config.instances_per_family, seed=config.seed)
            ]
        if leaked := [i.instance_id for i in instances if i.split != "train"]:
            raise PosttrainError(f"task pool must hold train-split instances only; got {leaked[:3]}")
        self.instances: dict[str, TaskInstance] = {i.instance_id: i for i in instances}
        self.by_family: dict[str, list[str]] = {
            family: [i.instance_id for i in instances if i.family == family] for family in config.families
        }
        if empty := [f for f, ids in self.by_family.items() if not ids]:
            raise PosttrainError(f"task pool has no instances for families {empty}")
        self.state = PoolState(tiers={f: config.start_tier for f in config.families})
        self.quotas = self._quotas()

    def _quotas(self) -> dict[str, float]:
        given = {f: q for f, q in self.config.quotas.items() if f in self.config.families}
        rest = [f for f in self.config.families if f not in given]
        left = max(0.0, 1.0 - sum(given.values()))
        quotas = {**given, **{f: left / len(rest) for f in rest}} if rest else given
        total = sum(quotas.values())
        if total <= 0:
            raise PosttrainError(f"task quotas {self.config.quotas} leave no family any share")
        return {f: q / total for f, q in quotas.items()}

    def uses_episodes(self, family: str) -> bool:
        """Whether ``family`` is rolled out as multi-turn tool episodes (else one completion per prompt)."""
        return uses_episodes(family, self.config.rollout)

    def instance(self, instance_id: str) -> TaskInstance:
        try:
            return self.instances[instance_id]
        except KeyError as exc:
            raise PosttrainError(f"instance {instance_id!r} is not in the task pool") from exc

    def task_set(self) -> dict[str, object]:
        """What lineage records about the task set: families, split, seeds and instance ids."""
        return {
            "split": "train",
            "seed": self.config.seed,
            "families": {f: {"n": len(ids), "quota": self.quotas[f]} for f, ids in self.by_family.items()},
            "instance_ids_sha": _ids_digest(sorted(self.instances)),
        }

    # ------------------------------------------------------------- curriculum
    def _in_tier(self, family: str) -> list[str]:
        """The family's prompts at or below its current tier (all of them without tiers)."""
        ids = self.by_family[family]
        if self.config.tiers:
            allowed = DIFFICULTIES[: DIFFICULTIES.index(self.state.tiers[family]) + 1]
            ids = [i for i in ids if self.instances[i].difficulty in allowed]
        return ids

    def _eligible(self, family: str) -> list[str]:
        ids = self._in_tier(family)
        live = [i for i in ids if not self.state.grades.get(i, Grade()).degenerate]
        # Everything graded degenerate: retry the whole tier rather than starve the family.
        return live or ids

    def sample(self, n: int, rng: random.Random) -> list[str]:
        """``n`` instance ids drawn by family quota from each family's eligible prompts."""
        families = list(self.quotas)
        weights = [self.quotas[f] for f in families]
        return [rng.choice(self._eligible(rng.choices(families, weights)[0])) for _ in range(n)]

    def draw_fitting(
        self,
        n: int,
        rng_for_draw: Callable[[int], random.Random],
        prompt_tokens: Callable[[TaskInstance], int],
        budget: int,
        setting: str,
        max_skips: int = 64,
    ) -> list[TaskInstance]:
        """``n`` instances drawn one at a time (draw ``d`` uses ``rng_for_draw(d)``, ``state.draws`` counts
        every draw, so a resumed run draws the same), leaving out those whose ``prompt_tokens`` exceed
        ``budget``: a prompt longer than the rollout window or the learner's ``max_length`` would fail on the
        engine and in the learner rather than train. Each one left out is logged; more than ``max_skips`` in
        one call means the tier's prompts do not fit ``setting`` at all, which is an error naming it."""
        drawn: list[TaskInstance] = []
        skipped = 0
        while len(drawn) < n:
            draw = self.state.draws
            self.state.draws += 1
            (instance_id,) = self.sample(1, rng_for_draw(draw))
            instance = self.instances[instance_id]
            tokens = prompt_tokens(instance)
            if tokens <= budget:
                drawn.append(instance)
                continue
            skipped += 1
            self.state.too_long += 1
            log.warning(
                "event=prompt_too_long instance=%s difficulty=%s tokens=%d budget=%d setting=%s",
                instance_id, instance.difficulty, tokens, budget, setting,
            )  # fmt: skip
            if skipped > max_skips:
                raise PosttrainError(
                    f"{skipped} prompts in a row need more than {budget} tokens ({setting}, less the completion "
                    f"budget); raise {setting} or keep the curriculum on a lower tier (pool.min_attempts_to_promote)"
                )
        return drawn

    def balanced(self, n: int) -> list[str]:
        """``n`` ids interleaving families by quota, deterministic (for SFT mixtures)."""
        counts = {f: round(n * q) for f, q in self.quotas.items()}
        order: list[str] = []
        cursors = dict.fromkeys(counts, 0)
        while len(order) < n and any(cursors[f] < counts[f] for f in counts):
            for family in counts:
                if cursors[family] < counts[family]:
                    ids = self._in_tier(family)
                    order.append(ids[cursors[family] % len(ids)])
                    cursors[family] += 1
        return order[:n]

    def record_group(self, instance_id: str, outcomes: list[bool]) -> bool:
        """Grade one prompt's group of rollouts; returns False when the group is degenerate (dropped)."""
        grade = self.state.grades.setdefault(instance_id, Grade())
        grade.attempts += len(outcomes)
        grade.correct += sum(outcomes)
        grade.last_group = list(outcomes)
        kept = not grade.degenerate
        if kept:
            self.state.kept_groups += 1
        else:
            self.state.dropped_groups += 1
        self._maybe_promote(self.instances[instance_id].family)
        return kept

    def family_pass_rate(self, family: str, tier: Difficulty | None = None) -> tuple[float, int]:
        attempts = correct = 0
        for instance_id in self.by_family[family]:
            if tier and self.instances[instance_id].difficulty != tier:
                continue
            grade = self.state.grades.get(instance_id)
            if grade:
                attempts += grade.attempts
                correct += grade.correct
        return (correct / attempts if attempts else 0.0), attempts

    def _maybe_promote(self, family: str) -> None:
        tier = self.state.tiers[family]
        rate, attempts = self.family_pass_rate(family, tier)
        position = DIFFICULTIES.index(tier)
        if (
            attempts >= self.config.min_attempts_to_promote
            and rate >= self.config.promote_pass_rate
            and position + 1 < len(DIFFICULTIES)
        ):
            self.state.tiers[family] = DIFFICULTIES[position + 1]
            log.info(
                "event=tier_promoted family=%s from=%s to=%s pass_rate=%.3f",
                family,
                tier,
                self.state.tiers[family],
                rate,
            )

    def iter_families(self) -> Iterator[Family]:
        yield from self.config.families


def _ids_digest(ids: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(ids).encode()).hexdigest()
