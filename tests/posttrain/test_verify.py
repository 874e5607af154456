"""Batch verification: Ray tasks give the same verdicts as in-process scoring, and auto picks by family."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evalsuite.generators import generate_instances
from posttrain.formats import format_for
from posttrain.verify import resolve_backend, verify_batch


@pytest.fixture()
def local_ray() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_auto_uses_ray_only_for_sandboxed_families() -> None:
    documents = generate_instances("documents", "train", 2, seed=0)
    terminal = generate_instances("terminal", "train", 1, seed=0)
    assert resolve_backend("auto", documents) == "serial"
    assert resolve_backend("auto", documents + terminal) == "ray"
    assert resolve_backend("serial", terminal) == "serial"
    with pytest.raises(ValueError, match="2 instances but 1 completions"):
        verify_batch(documents, ["x"])


@pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="bubblewrap not installed")
def test_ray_verdicts_equal_serial_verdicts(local_ray: None) -> None:
    terminal = generate_instances("terminal", "train", 3, seed=0)
    documents = generate_instances("documents", "train", 2, seed=0)
    instances, completions = [], []
    for instance in terminal + documents:
        rollout = format_for(instance.family)
        instances += [instance, instance]
        completions += [rollout.demonstration(instance), "```bash\ntrue\n```\nANSWER: no such value"]
    serial = verify_batch(instances, completions, "serial")
    parallel = verify_batch(instances, completions, "ray")
    assert [(r.correct, r.score, p) for r, p in parallel] == [(r.correct, r.score, p) for r, p in serial]
    # The right answers pass and the wrong ones fail, so equality above is not two empty verdicts.
    assert [r.correct for r, _ in parallel] == [True, False] * len(terminal + documents)
