"""Chaos (issue 17): memory and fork bombs in RL verification.

A batch of terminal rollouts goes through the reward function RL trains with (``VerifierReward``, which calls
``verify_batch`` and then each family's ``score``), with bombs among the reference solutions. Each bomb
rollout must score 0 with the limit it hit in its traced components, the others must score as usual, the
batch must finish in bounded time, and nothing of the bombs may survive on the host.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from evalsuite.sandbox import bwrap_available
from evalsuite.sandbox_limits import SandboxCgroup
from posttrain.config import RewardConfig, TaskPoolConfig
from posttrain.formats import format_for
from posttrain.pool import TaskPool
from posttrain.rewards import VerifierReward, combine_reward
from posttrain.trace import TraceWriter, read_trace

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (bwrap) not usable here"),
]

MARKER = f"tandem-bomb-{uuid.uuid4().hex[:8]}"
MAX_COMPLETION_LENGTH = 256
# Each bomb's script and the limits it may be reported under (a fork bomb without stderr and without a
# cgroup can only be seen as a timeout).
BOMBS: dict[str, tuple[str, set[str]]] = {
    "python_memory": (f"python3 -c \"a=[]  # {MARKER}\nwhile True: a.append(' '*10**7)\"", {"memory_limit"}),
    "tail_dev_zero": (f"exec -a {MARKER} tail /dev/zero", {"memory_limit"}),
    # exec -a names every forked copy of the shell after the marker, so leftovers can be found.
    "bash_fork_bomb": (f"exec -a {MARKER} bash -c ':(){{ :|:& }};:; sleep 30'", {"process_limit", "timeout"}),
    "python_fork_loop": (
        f'python3 -c "import os  # {MARKER}\nwhile True:\n    try: os.fork()\n    except OSError: pass"',
        {"process_limit", "timeout"},
    ),
}


def bomb_processes(grace_s: float = 5.0) -> list[str]:
    """Host processes of the bombs (the marker is in each one's command line) still there after ``grace_s``
    (a killed pid namespace takes a moment to be reaped)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for process in psutil.process_iter(["pid", "status", "cmdline"]):
            cmdline = " ".join(process.info["cmdline"] or [])
            if MARKER in cmdline:
                left.append(f"{process.info['pid']} ({process.info['status']}): {cmdline[:120]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


class MemoryWatch:
    """Samples the host's available memory in the background; ``lowest`` is the minimum seen."""

    def __init__(self) -> None:
        self.lowest = psutil.virtual_memory().available
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.lowest = min(self.lowest, psutil.virtual_memory().available)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture()
def local_ray() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def run_batch(
    tmp_path: Path, bombs: dict[str, str], backend: str
) -> tuple[list[float], list[Any], list[str], float, int]:
    """One RL reward call over groups of (reference solution, bomb): rewards, trace records, the kinds of
    rollout in order, seconds taken and the lowest available host memory seen meanwhile."""
    pool = TaskPool(TaskPoolConfig(families=["terminal"], instances_per_family=12, seed=0))
    trace = TraceWriter(tmp_path)
    reward = VerifierReward(
        pool,
        RewardConfig(verify=backend),  # type: ignore[arg-type]
        trace,
        sampling={"temperature": 1.0},
        num_generations=2,
        max_completion_length=MAX_COMPLETION_LENGTH,
    )
    identifiers = pool.balanced(len(bombs))
    rollout = format_for("terminal")
    ids, completions, kinds = [], [], []
    for ident, (name, script) in zip(identifiers, bombs.items(), strict=True):
        ids += [ident, ident]
        completions += [rollout.demonstration(pool.instance(ident)), f"```bash\n{script}\n```"]
        kinds += ["normal", name]
    started = time.monotonic()
    with MemoryWatch() as memory:
        rewards = reward(prompts=["p"] * len(ids), completions=completions, instance_id=ids)
    elapsed = time.monotonic() - started
    trace.seal()
    records = [r for r in read_trace(tmp_path) if r.kind == "rollout"]
    return [float(r) for r in rewards if r is not None], records, kinds, elapsed, memory.lowest


def check_batch(
    rewards: list[float], records: list[Any], kinds: list[str], expected: dict[str, set[str]]
) -> tuple[int, list[str]]:
    """Bomb rollouts that scored 0 with an expected limit traced, and what went wrong otherwise."""
    clean, problems = 0, []
    config = RewardConfig()
    for reward, record, kind in zip(rewards, records, kinds, strict=True):
        if kind == "normal":
            usual = combine_reward(
                config, True, 1.0, 1.0, len(record.completion.split()) / MAX_COMPLETION_LENGTH
            )
            if not (record.correct and reward == pytest.approx(usual)):
                problems.append(f"normal rollout scored {reward} ({record.explanation})")
            continue
        traced = {name for name in expected[kind] if record.components.get(name) == 1.0}
        if reward == 0.0 and traced and "sandbox limit hit" in record.explanation:
            clean += 1
        else:
            problems.append(
                f"{kind}: reward {reward}, components {record.components}, {record.explanation!r}"
            )
    return clean, problems


@pytest.mark.parametrize("backend", ["serial", "ray"])
def test_bombs_in_an_rl_batch_score_zero_and_leave_nothing_behind(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, chaos_report: Callable[..., Any]
) -> None:
    if backend == "ray":
        request.getfixturevalue("local_ray")
    rewards, records, kinds, elapsed, lowest = run_batch(
        tmp_path, {name: script for name, (script, _) in BOMBS.items()}, backend
    )
    leftovers = bomb_processes()
    clean, problems = check_batch(
        rewards, records, kinds, {name: limits for name, (_, limits) in BOMBS.items()}
    )
    chaos_report(
        f"memory and fork bombs in RL verification ({backend})",
        requests=len(kinds),
        clean_errors=clean,
        failures=len(problems) + len(leftovers),
        detail="; ".join(
            f"{k}: {r.explanation}" for k, r in zip(kinds, records, strict=True) if k != "normal"
        ),
        extra={"batch_s": round(elapsed, 2), "lowest_available_mib": lowest >> 20},
    )
    assert problems == []
    assert clean == len(BOMBS)
    assert leftovers == []
    assert elapsed < 45, f"batch took {elapsed:.1f}s"
    assert lowest > 1 << 30


def test_fork_and_allocate_bomb_is_bounded_by_the_sandbox_cgroup(
    tmp_path: Path, chaos_report: Callable[..., Any]
) -> None:
    """Per-process limits alone let 32 processes take 32 x 400 MiB; the sandbox cgroup caps the sum."""
    probe = SandboxCgroup.create(f"tandem-probe-{MARKER}", 1 << 30, 16)
    if probe is None or probe.memory_dir is None:
        pytest.skip("no writable memory cgroup here: only per-process memory limits apply")
    probe.remove()
    script = (
        f'python3 -c "import os, time  # {MARKER}\n'
        "for _ in range(5): os.fork()\n"
        "a = b'x' * (400 << 20)\n"
        'time.sleep(30)"'
    )
    rewards, records, kinds, elapsed, lowest = run_batch(tmp_path, {"fork_and_allocate": script}, "serial")
    leftovers = bomb_processes()
    clean, problems = check_batch(rewards, records, kinds, {"fork_and_allocate": {"memory_limit"}})
    chaos_report(
        "fork-and-allocate bomb in RL verification",
        requests=len(kinds),
        clean_errors=clean,
        failures=len(problems) + len(leftovers),
        detail=records[1].explanation,
        extra={"batch_s": round(elapsed, 2), "lowest_available_mib": lowest >> 20},
    )
    assert problems == [] and clean == 1 and leftovers == []
    assert elapsed < 30


def test_without_cgroups_the_limits_still_hold_and_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chaos_report: Callable[..., Any]
) -> None:
    """Hosts that refuse cgroups: RLIMIT_AS / RLIMIT_NPROC and the wall clock still stop every bomb, and
    the limit is read from stderr (or is the timeout)."""
    monkeypatch.setattr(SandboxCgroup, "create", classmethod(lambda cls, *args: None))
    monkeypatch.setattr("posttrain.formats.SOLUTION_TIMEOUT_S", 4)
    rewards, records, kinds, elapsed, lowest = run_batch(
        tmp_path, {name: script for name, (script, _) in BOMBS.items()}, "serial"
    )
    leftovers = bomb_processes()
    clean, problems = check_batch(
        rewards, records, kinds, {name: limits for name, (_, limits) in BOMBS.items()}
    )
    chaos_report(
        "memory and fork bombs in RL verification, no cgroups",
        requests=len(kinds),
        clean_errors=clean,
        failures=len(problems) + len(leftovers),
        detail="; ".join(
            f"{k}: {r.explanation}" for k, r in zip(kinds, records, strict=True) if k != "normal"
        ),
        extra={"batch_s": round(elapsed, 2), "lowest_available_mib": lowest >> 20},
    )
    assert problems == [] and clean == len(BOMBS) and leftovers == []
    assert elapsed < 50
