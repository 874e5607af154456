"""Verdicts of a GRPO step's rollouts on Ray: single-turn completions are verified in this process for cheap
families, else as scheduler jobs (retries, quarantine); multi-turn episodes arrive already scored (their verdict
ran in the episode's own environment, before it closed)."""

from __future__ import annotations

from functools import partial
from typing import Any

from evalsuite.schema import TaskInstance, VerifierResult
from posttrain.distributed.scheduler import Job, Scheduler
from posttrain.formats import format_for
from posttrain.verify import VerifyBackend, _score, resolve_backend, with_known_verdicts

_remote_score: Any = None


def scheduled_verdicts(
    scheduler: Scheduler,
    backend: VerifyBackend,
    step: int,
    instances: list[TaskInstance],
    texts: list[str],
    known: list[dict[str, Any] | None],
) -> list[tuple[VerifierResult, float]]:
    """``(verdict, protocol score)`` per rollout, in order; ``known`` verdicts (episodes) are taken as they are."""
    return with_known_verdicts(
        known,
        lambda pending: _verify_texts(
            scheduler, backend, step, [instances[i] for i in pending], [texts[i] for i in pending]
        ),
    )


def _verify_texts(
    scheduler: Scheduler, backend: VerifyBackend, step: int, instances: list[TaskInstance], texts: list[str]
) -> list[tuple[VerifierResult, float]]:
    """Verdicts in order: in this process for cheap families, else as scheduler jobs (retries, quarantine).
    A quarantined verdict counts as wrong (reward 0) and is traced, never dropped silently."""
    if not instances:
        return []
    if resolve_backend(backend, instances) == "serial":
        return [format_for(i.family).score(i, t) for i, t in zip(instances, texts, strict=True)]
    jobs = [
        Job(
            key=f"verify:{step}:{index}",
            domain=instance.family,
            kind="verify",
            launch=partial(_launch_verify, instance=instance.model_dump(mode="json"), completion=text),
        )
        for index, (instance, text) in enumerate(zip(instances, texts, strict=True))
    ]
    results, failures = scheduler.run(jobs)
    lost = {failure.key: failure for failure in failures}
    verdicts = []
    for job in jobs:
        if job.key in results:
            result, protocol = results[job.key]
            verdicts.append((VerifierResult.model_validate(result), protocol))
        else:
            errors = "; ".join(lost[job.key].errors[-2:]) if job.key in lost else "no result"
            verdicts.append(
                (
                    VerifierResult(
                        score=0.0, correct=False, explanation=f"verification quarantined: {errors}"
                    ),
                    0.0,
                )
            )
    return verdicts


def _launch_verify(_: Any, *, instance: dict[str, Any], completion: str) -> Any:
    global _remote_score
    import ray

    if _remote_score is None:
        _remote_score = ray.remote(num_cpus=0.5, max_retries=0)(_score)
    return _remote_score.remote(instance, completion)
