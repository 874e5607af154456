"""Which resource limit a sandboxed command ran into, and a per-sandbox cgroup that bounds the whole tree.

``prlimit`` bounds each process (address space, process count per uid), which leaves a fork-and-allocate
bomb free to multiply its per-process memory by the process limit. When the host lets this process create
cgroups (root with a writable cgroup v1 ``memory``/``pids`` hierarchy, or a delegated cgroup v2 subtree), each
sandbox also gets a cgroup capping its total memory and task count; its counters say exactly which limit
was hit. Where cgroups are not available, the limit is read from the command's stderr (the messages that
ENOMEM and EAGAIN from ``fork`` produce) and the per-process limits still hold.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import time
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

SandboxLimit = Literal["timeout", "memory_limit", "process_limit", "output_limit"]
CGROUP_ROOT = Path("/sys/fs/cgroup")
_REMOVE_WAIT_S = 2.0

_MEMORY_MESSAGES = re.compile(
    r"MemoryError|Cannot allocate memory|memory exhausted|[Oo]ut of memory|std::bad_alloc|xmalloc: .*cannot allocate"
)
_PROCESS_MESSAGES = re.compile(
    r"fork: (retry: )?Resource temporarily unavailable|BlockingIOError: \[Errno 11\]|[Cc]an(no|')t fork"
)


def limits_in_stderr(stderr: str) -> list[SandboxLimit]:
    """Limits whose failure messages appear in a command's stderr (the fallback without cgroups)."""
    found: list[SandboxLimit] = []
    if _MEMORY_MESSAGES.search(stderr):
        found.append("memory_limit")
    if _PROCESS_MESSAGES.search(stderr):
        found.append("process_limit")
    return found


def _own_cgroups() -> dict[str, Path]:
    """This process's cgroup directory per controller (``memory``, ``pids``), v1 or v2, where mounted."""
    dirs: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            for controller in ("memory", "pids"):
                dirs.setdefault(controller, CGROUP_ROOT / relative)
        for controller in controllers.split(","):
            if controller in ("memory", "pids") and (CGROUP_ROOT / controller).is_dir():
                dirs[controller] = CGROUP_ROOT / controller / relative
    return {name: path for name, path in dirs.items() if path.is_dir()}


def _read_counter(path: Path, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (``memory.events``, ``pids.events``), 0 if absent."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


class SandboxCgroup:
    """A memory and pids cgroup for one sandbox, nested under this process's own cgroup."""

    def __init__(self, memory_dir: Path | None, pids_dir: Path | None) -> None:
        self.memory_dir = memory_dir
        self.pids_dir = pids_dir

    @classmethod
    def create(cls, name: str, memory_bytes: int, max_processes: int) -> SandboxCgroup | None:
        """The cgroup, or None when this host does not let us create one (not root, read-only, no v2
        delegation): the sandbox then runs on its per-process limits alone."""
        if os.geteuid() != 0:
            return None
        own = _own_cgroups()
        memory_dir = _make_limited(
            own.get("memory"), name, _memory_limit_files(own.get("memory")), memory_bytes
        )
        pids_dir = _make_limited(own.get("pids"), name, ("pids.max",), max_processes)
        if memory_dir is None and pids_dir is None:
            return None
        return cls(memory_dir, pids_dir)

    def enter_command(self) -> list[str]:
        """A command prefix that moves itself into the cgroup, then execs the rest of the command line."""
        files = [d / "cgroup.procs" for d in {self.memory_dir, self.pids_dir} if d is not None]
        moves = "; ".join(f"echo $$ > {shlex.quote(str(f))} || exit 125" for f in files)
        return ["/bin/sh", "-c", f'{moves}; exec "$@"', "sandbox-enter"]

    def counters(self) -> dict[SandboxLimit, int]:
        """How often each limit has been hit since the cgroup was made (monotonic)."""
        counts: dict[SandboxLimit, int] = {}
        if self.pids_dir is not None:
            counts["process_limit"] = _read_counter(self.pids_dir / "pids.events", "max")
        if self.memory_dir is not None:
            events = self.memory_dir / "memory.events"  # v2; v1 keeps the count in memory.oom_control
            source = events if events.exists() else self.memory_dir / "memory.oom_control"
            counts["memory_limit"] = _read_counter(source, "oom_kill")
        return counts

    def kill(self) -> None:
        """SIGKILL every process still in the cgroup."""
        for directory in {self.memory_dir, self.pids_dir}:
            if directory is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        """Kill what is left and delete the cgroup directories (idempotent)."""
        self.kill()
        pending = [d for d in {self.memory_dir, self.pids_dir} if d is not None]
        deadline = time.monotonic() + _REMOVE_WAIT_S
        while pending:  # a killed process leaves its cgroup only once reaped: rmdir is EBUSY until then
            for directory in list(pending):
                with contextlib.suppress(FileNotFoundError):
                    try:
                        directory.rmdir()
                    except OSError:
                        continue
                pending.remove(directory)
            if pending and time.monotonic() > deadline:
                log.warning("event=sandbox_cgroup_left paths=%s", ",".join(map(str, pending)))
                return
            if pending:
                self.kill()
                time.sleep(0.02)


def _memory_limit_files(parent: Path | None) -> tuple[str, ...]:
    if parent is not None and (parent / "memory.max").exists():
        return ("memory.max", "memory.swap.max")
    return ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")


def _make_limited(parent: Path | None, name: str, files: tuple[str, ...], value: int) -> Path | None:
    """``parent/name`` with ``value`` written to the first of ``files`` (the others best effort, as swap
    limits are often not compiled in); None, and nothing left behind, when that cannot be done."""
    if parent is None:
        return None
    directory = parent / name
    try:
        directory.mkdir()
    except OSError:
        return None
    try:
        (directory / files[0]).write_text(str(value))
    except OSError:
        with contextlib.suppress(OSError):
            directory.rmdir()
        return None
    for extra in files[1:]:
        with contextlib.suppress(OSError):
            (directory / extra).write_text(str(value) if extra.endswith("memsw.limit_in_bytes") else "0")
    return directory
