"""Seeded task generators with disjoint train/dev/test splits.

``generate_instances`` draws candidates from a seeded stream and keeps those whose *content hash* falls in
the requested split (:func:`evalsuite.schema.split_of`), so the splits cannot overlap whatever the seeds.
The ``rotation_key`` salts the stream used for the test split: a new key yields a fresh test set, still
disjoint from train and dev.
"""

from __future__ import annotations

import logging
import random

from evalsuite.errors import GeneratorError
from evalsuite.generators.base import Draft, derive_seed
from evalsuite.registry import get_family
from evalsuite.schema import DIFFICULTIES, Difficulty, Split, TaskInstance, content_digest, split_of

log = logging.getLogger(__name__)

DEFAULT_ROTATION_KEY = "r0"
# Candidates tried per kept instance before giving up (test keeps ~1 in 10 by design).
_MAX_ATTEMPTS_PER_INSTANCE = 200


def task_types(family: str) -> list[str]:
    """The task types a family generates, in a stable order."""
    return get_family(family).task_types()


def _instance(family: str, draft: Draft, difficulty: Difficulty, seed: int) -> TaskInstance:
    digest = content_digest(family, draft.task_type, draft.content())
    return TaskInstance(
        instance_id=f"{family[:3]}-{draft.task_type}-{digest[:16]}",
        family=family,
        task_type=draft.task_type,
        difficulty=difficulty,
        split=split_of(digest),
        seed=seed,
        prompt=draft.prompt,
        expected=draft.expected,
        files=draft.files,
        hidden_files=draft.hidden_files,
        checks=draft.checks,
        max_steps=draft.max_steps,
        metadata={**draft.metadata, "digest": digest},
    )


def generate_instance(family: str, task_type: str, difficulty: Difficulty, seed: int) -> TaskInstance:
    """Build exactly one instance from a seed (its split is whatever its content hashes to)."""
    builders = get_family(family).builders
    if task_type not in builders:
        raise GeneratorError(f"unknown task type {family}/{task_type} (allowed: {task_types(family)})")
    return _instance(family, builders[task_type](random.Random(seed), difficulty), difficulty, seed)


def generate_instances(
    family: str,
    split: Split,
    n: int,
    seed: int = 0,
    difficulty: Difficulty | None = None,
    rotation_key: str = DEFAULT_ROTATION_KEY,
    task_type: str | None = None,
) -> list[TaskInstance]:
    """Return ``n`` distinct instances of ``family`` that belong to ``split``, deterministically.

    Task types and difficulties are cycled round-robin (fixed when given) so a small ``n`` still covers
    them. The same arguments always give the same instances; ``rotation_key`` changes only the test split.
    """
    types = [task_type] if task_type else task_types(family)
    tiers: list[Difficulty] = [difficulty] if difficulty else list(DIFFICULTIES)
    if task_type and task_type not in get_family(family).builders:
        raise GeneratorError(f"unknown task type {family}/{task_type} (allowed: {task_types(family)})")
    stream_salt = rotation_key if split == "test" else ""
    kept: list[TaskInstance] = []
    seen: set[str] = set()
    attempts = 0
    while len(kept) < n:
        slot = len(kept)
        chosen_type = types[slot % len(types)]
        chosen_tier = tiers[(slot // len(types)) % len(tiers)]
        attempts += 1
        if attempts > _MAX_ATTEMPTS_PER_INSTANCE * max(n, 1):
            raise GeneratorError(
                f"could not generate {n} {family} instances for split {split} (got {len(kept)})"
            )
        candidate_seed = derive_seed(family, split, stream_salt, seed, slot, attempts)
        instance = generate_instance(family, chosen_type, chosen_tier, candidate_seed)
        if instance.split != split or instance.instance_id in seen:
            continue
        seen.add(instance.instance_id)
        kept.append(instance)
    log.debug("event=generated family=%s split=%s n=%d attempts=%d", family, split, n, attempts)
    return kept


__all__ = ["DEFAULT_ROTATION_KEY", "generate_instance", "generate_instances", "task_types"]
