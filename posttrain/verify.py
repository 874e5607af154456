"""Verifying a batch of rollouts: in this process, or fanned out as Ray tasks.

A terminal verdict runs the completion's script in a fresh bubblewrap sandbox (tens to hundreds of ms, most
of it waiting on processes), so a GRPO batch of them is verified in parallel on Ray; a documents verdict is a
string comparison (microseconds), where a Ray round trip would cost more than it saves. ``auto`` picks by
the batch's families. Ray is joined if the trainer runs inside a cluster, else started locally once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal

from evalsuite.schema import TaskInstance, VerifierResult
from infra.lifecycle import init_ray
from posttrain.formats import format_for

log = logging.getLogger(__name__)

VerifyBackend = Literal["auto", "serial", "ray"]
SANDBOXED_FAMILIES = frozenset({"terminal"})

_remote_score: Any = None


def _score(instance: dict[str, Any], completion: str) -> tuple[dict[str, Any], float]:
    """One verdict, from plain data so it crosses a process boundary (runs in a Ray worker)."""
    task = TaskInstance.model_validate(instance)
    result, protocol = format_for(task.family).score(task, completion)
    return result.model_dump(), protocol


def resolve_backend(backend: VerifyBackend, instances: Sequence[TaskInstance]) -> Literal["serial", "ray"]:
    if backend != "auto":
        return backend
    return "ray" if any(i.family in SANDBOXED_FAMILIES for i in instances) else "serial"


def _ray_score() -> Any:
    global _remote_score
    import ray

    if not ray.is_initialized():
        # Joins RAY_ADDRESS when set (a cluster); otherwise a local Ray sized to this machine.
        init_ray(include_dashboard=False, log_to_driver=False, configure_logging=False)
        log.info("event=verify_ray_started resources=%s", ray.cluster_resources())
    if _remote_score is None:
        _remote_score = ray.remote(num_cpus=0.5, max_retries=2)(_score)
    return _remote_score


def with_known_verdicts(
    known: Sequence[dict[str, Any] | None],
    verify_pending: Callable[[list[int]], list[tuple[VerifierResult, float]]],
) -> list[tuple[VerifierResult, float]]:
    """``(verdict, protocol score)`` per rollout, in order: a ``known`` verdict (a multi-turn episode, scored where
    it was played, before its environment closed) as it is, the others from ``verify_pending(their indices)``."""
    pending = [index for index, verdict in enumerate(known) if verdict is None]
    checked = iter(verify_pending(pending))
    verdicts = []
    for verdict in known:
        if verdict is None:
            verdicts.append(next(checked))
        else:
            result = VerifierResult.model_validate(verdict)
            verdicts.append((result, result.components.get("protocol", 1.0)))
    return verdicts


def verify_batch(
    instances: Sequence[TaskInstance], completions: Sequence[str], backend: VerifyBackend = "auto"
) -> list[tuple[VerifierResult, float]]:
    """``(verdict, protocol score)`` per completion, in order; the same values whichever backend runs."""
    if len(instances) != len(completions):
        raise ValueError(f"{len(instances)} instances but {len(completions)} completions")
    chosen = resolve_backend(backend, instances)
    if chosen == "serial" or not instances:
        return [format_for(i.family).score(i, c) for i, c in zip(instances, completions, strict=True)]
    import ray

    remote = _ray_score()
    refs = [remote.remote(i.model_dump(mode="json"), c) for i, c in zip(instances, completions, strict=True)]
    return [(VerifierResult.model_validate(result), protocol) for result, protocol in ray.get(refs)]
