"""Inspect sandbox provider ``bwrap``: each exec runs in a fresh bubblewrap jail over a per-sample tree.

Isolation per exec: all namespaces unshared (no network: only loopback in a new net namespace), a private
/proc and /dev, read-only system binds, the sample's working tree at ``/workspace`` and its own ``/tmp``,
a fresh session (no terminal injection), and, when the host runs as root, an unprivileged uid of its own
so that process limits are per sandbox. Resource limits come from ``prlimit`` (CPU seconds, address space,
processes, file size, open files), plus a wall-clock timeout and an output cap enforced here; where the host
allows it, a cgroup per sandbox also caps the memory and tasks of the whole tree (``evalsuite.sandbox_limits``).
The whole process tree dies with bwrap (``--die-with-parent`` and the pid namespace), including on
cancellation. Every limit a command runs into is recorded in :attr:`BwrapSandboxEnvironment.limits_hit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal, overload

from inspect_ai.util import (
    ExecResult,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    sandboxenv,
)
from inspect_ai.util._sandbox.environment import SandboxUserUnsupportedError
from pydantic import BaseModel, ConfigDict, Field

from evalsuite.errors import SandboxError
from evalsuite.sandbox_limits import SandboxCgroup, SandboxLimit, limits_in_stderr

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"
ROOT_PREFIX = "tandem-bwrap-"
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
_PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"
_SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
# Unprivileged uids handed to sandboxes when the host runs as root; offset by pid so two eval processes
# on one host rarely share a uid (sharing only means sharing the process limit).
_UID_BASE = 1_600_000 + (os.getpid() % 4096) * 256
_uid_counter = itertools.count()
# With a pids cgroup, RLIMIT_NPROC is only a backstop set above it, so the cgroup (which counts) is hit first.
_NPROC_BACKSTOP = 32
_LIMIT_POLL_S = 0.1


class BwrapConfig(BaseModel):
    """Limits and layout of the ``bwrap`` sandbox (pass as ``sandbox=("bwrap", BwrapConfig(...))``)."""

    model_config = ConfigDict(frozen=True)  # Inspect hashes sandbox specs

    snapshot_dir: str | None = Field(default=None, description="Copied into /workspace for every sample.")
    cpu_seconds: int = Field(default=30, description="RLIMIT_CPU per process tree member, seconds.")
    memory_bytes: int = Field(default=1 << 30, description="RLIMIT_AS (address space) per process.")
    max_processes: int = Field(
        default=128, description="Tasks of the sandbox (pids cgroup), else RLIMIT_NPROC for its uid."
    )
    memory_total_bytes: int = Field(
        default=2 << 30, description="Memory of the whole sandbox tree (memory cgroup, where available)."
    )
    use_cgroup: bool = Field(
        default=True, description="Give each sandbox a memory + pids cgroup when the host allows it."
    )
    kill_on_limit: bool = Field(
        default=True,
        description="End a command as soon as its cgroup reports a memory or process limit hit (a bomb "
        "then stops in well under a second instead of spinning until the wall timeout).",
    )
    max_file_bytes: int = Field(
        default=64 << 20, description="RLIMIT_FSIZE: largest file a process may write."
    )
    max_open_files: int = Field(default=256, description="RLIMIT_NOFILE.")
    wall_timeout: int = Field(
        default=60, description="Upper bound on any exec, seconds (caller may ask less)."
    )
    output_limit_bytes: int = Field(
        default=1 << 20, description="Cap per stream; the process is killed past it."
    )
    ro_binds: tuple[str, ...] = Field(default=("/usr", "/etc"), description="Read-only system binds.")
    drop_privileges: bool = Field(default=True, description="When root, run as a fresh unprivileged uid.")
    root_parent: str | None = Field(
        default=None, description="Where per-sample trees live (default: TMPDIR)."
    )


def bwrap_available() -> bool:
    """True when bubblewrap exists and can create its namespaces here."""
    if not Path(_BWRAP).exists():
        return False
    try:
        import subprocess

        probe = subprocess.run(
            [_BWRAP, "--unshare-all", "--ro-bind", "/usr", "/usr", *_system_links(), "/usr/bin/true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _system_links() -> list[str]:
    """bwrap arguments recreating /bin, /lib, /lib64, /sbin as on the host (symlinks into /usr or binds)."""
    arguments: list[str] = []
    for top in ("bin", "lib", "lib64", "sbin"):
        host = Path("/") / top
        if host.is_symlink():
            arguments += ["--symlink", os.readlink(host), f"/{top}"]
        elif host.is_dir():
            arguments += ["--ro-bind", str(host), f"/{top}"]
    return arguments


def _resolve_config(config: SandboxEnvironmentConfigType | None) -> BwrapConfig:
    if config is None:
        return BwrapConfig()
    if isinstance(config, BwrapConfig):
        return config
    if isinstance(config, str):
        from infra.config import load_model_file

        return load_model_file(Path(config), BwrapConfig)
    if isinstance(config, BaseModel):
        return BwrapConfig.model_validate(config.model_dump())
    raise SandboxError(
        f"bwrap sandbox config must be a BwrapConfig or a YAML path, got {type(config).__name__}"
    )


def _chown_tree(path: Path, uid: int) -> None:
    os.chown(path, uid, uid, follow_symlinks=False)
    for parent, dirs, files in os.walk(path):
        for name in itertools.chain(dirs, files):
            os.chown(os.path.join(parent, name), uid, uid, follow_symlinks=False)


def _remove_tree(path: Path) -> None:
    def make_writable(func: Any, failed: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), stat.S_IRWXU)
            func(failed)

    shutil.rmtree(path, onerror=make_writable)


@sandboxenv(name="bwrap")
class BwrapSandboxEnvironment(SandboxEnvironment):
    """One sample's sandbox: a host directory holding ``workspace/`` and ``tmp/``, jailed per exec."""

    def __init__(self, config: BwrapConfig) -> None:
        super().__init__()
        self.config = config
        self.root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX, dir=config.root_parent))
        self.workspace = self.root / "workspace"
        self.tmp = self.root / "tmp"
        self.uid: int | None = None
        if config.drop_privileges and os.geteuid() == 0:
            self.uid = _UID_BASE + next(_uid_counter) % 256
        self._running: set[asyncio.subprocess.Process] = set()
        self.limits_hit: list[SandboxLimit] = []
        self.cgroup = (
            SandboxCgroup.create(self.root.name, config.memory_total_bytes, config.max_processes)
            if config.use_cgroup
            else None
        )
        if config.snapshot_dir:
            shutil.copytree(config.snapshot_dir, self.workspace, symlinks=True)
        else:
            self.workspace.mkdir()
        self.tmp.mkdir()
        if self.uid is not None:
            _chown_tree(self.root, self.uid)

    # ------------------------------------------------------------- lifecycle
    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        if not Path(_BWRAP).exists():
            raise SandboxError("bubblewrap (bwrap) is not installed; run `make system-deps`")
        _resolve_config(config)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        environment = cls(_resolve_config(config))
        log.debug("event=sandbox_init task=%s root=%s uid=%s", task_name, environment.root, environment.uid)
        return {"default": environment}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            await environment.as_type(BwrapSandboxEnvironment).close()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        for path in Path(tempfile.gettempdir()).glob(f"{ROOT_PREFIX}{id or ''}*"):
            _remove_tree(path)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return BwrapConfig(**config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        return max(1, (os.cpu_count() or 1) * 2)

    def default_polling_interval(self) -> float:
        return 0.2

    async def close(self) -> None:
        """Kill anything still running and delete the sample's tree (idempotent)."""
        for process in list(self._running):
            self._kill(process)
        self._running.clear()
        if self.cgroup is not None:
            self.cgroup.remove()
        await asyncio.to_thread(_remove_tree, self.root)
        log.debug("event=sandbox_cleanup root=%s", self.root)

    # ------------------------------------------------------------- exec
    def command_line(self, cmd: list[str], cwd: str | None, env: dict[str, str] | None) -> list[str]:
        """The full host command line that runs ``cmd`` in the jail."""
        limits = [
            f"--cpu={self.config.cpu_seconds}",
            f"--as={self.config.memory_bytes}",
            f"--nproc={self.config.max_processes + (_NPROC_BACKSTOP if self._counts_processes() else 0)}",
            f"--fsize={self.config.max_file_bytes}",
            f"--nofile={self.config.max_open_files}",
            "--core=0",
        ]
        jail = [_BWRAP, "--unshare-all", "--die-with-parent", "--new-session"]
        for bind in self.config.ro_binds:
            if Path(bind).exists():
                jail += ["--ro-bind", bind, bind]
        jail += _system_links()
        workdir = WORKSPACE if cwd is None else (cwd if cwd.startswith("/") else f"{WORKSPACE}/{cwd}")
        jail += [
            "--proc", "/proc", "--dev", "/dev",
            "--bind", str(self.workspace), WORKSPACE,
            "--bind", str(self.tmp), "/tmp",
            "--chdir", workdir,
            "--clearenv",
            "--setenv", "PATH", _SYSTEM_PATH,
            "--setenv", "HOME", WORKSPACE,
            "--setenv", "TMPDIR", "/tmp",
            "--setenv", "LANG", "C.UTF-8",
        ]  # fmt: skip
        for key, value in (env or {}).items():
            jail += ["--setenv", key, value]
        prefix = self.cgroup.enter_command() if self.cgroup is not None else []
        if self.uid is not None:
            prefix += [_SETPRIV, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        return [*prefix, _PRLIMIT, *limits, "--", *jail, "--", *cmd]

    def _counts_processes(self) -> bool:
        return self.cgroup is not None and self.cgroup.pids_dir is not None

    def _record_limits(self, limits: list[SandboxLimit], cmd: list[str]) -> None:
        for limit in dict.fromkeys(limits):
            log.info("event=sandbox_limit limit=%s root=%s cmd=%s", limit, self.root, " ".join(cmd)[:200])
            if limit not in self.limits_hit:
                self.limits_hit.append(limit)

    def _cgroup_hits(self, before: dict[SandboxLimit, int]) -> list[SandboxLimit]:
        if self.cgroup is None:
            return []
        return [limit for limit, count in self.cgroup.counters().items() if count > before.get(limit, 0)]

    def _kill(self, process: asyncio.subprocess.Process) -> None:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        if user not in (None, "", "sandbox"):
            raise SandboxUserUnsupportedError(f"bwrap sandbox runs commands as one user only, not {user!r}")
        wall = min(timeout, self.config.wall_timeout) if timeout else self.config.wall_timeout
        limit = self.config.output_limit_bytes
        process = await asyncio.create_subprocess_exec(
            *self.command_line(cmd, cwd, env),
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._running.add(process)
        overflow: list[str] = []
        before = self.cgroup.counters() if self.cgroup is not None else {}

        async def drain(stream: asyncio.StreamReader, name: str) -> bytes:
            chunks: list[bytes] = []
            size = 0
            while chunk := await stream.read(65536):
                if size + len(chunk) > limit:
                    chunks.append(chunk[: limit - size])
                    overflow.append(name)
                    self._kill(process)
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)

        async def feed() -> None:
            if input is None or process.stdin is None:
                return
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(input.encode() if isinstance(input, str) else input)
                await process.stdin.drain()
                process.stdin.close()

        async def watch() -> None:
            if self.cgroup is None or not self.config.kill_on_limit:
                return
            while process.returncode is None:
                await asyncio.sleep(_LIMIT_POLL_S)
                if self._cgroup_hits(before):
                    self._kill(process)
                    return

        assert process.stdout is not None and process.stderr is not None
        try:
            async with asyncio.timeout(wall):
                _, out, err, _ = await asyncio.gather(
                    feed(), drain(process.stdout, "stdout"), drain(process.stderr, "stderr"), watch()
                )
                returncode = await process.wait()
        except TimeoutError:
            log.info("event=sandbox_timeout root=%s seconds=%s", self.root, wall)
            self._record_limits(["timeout", *self._cgroup_hits(before)], cmd)
            raise TimeoutError(f"command timed out after {wall} seconds") from None
        finally:
            self._kill(process)
            self._running.discard(process)
            with contextlib.suppress(Exception):  # reap it so no transport outlives the event loop
                await asyncio.wait_for(asyncio.shield(process.wait()), 5)
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        hits = self._cgroup_hits(before) + limits_in_stderr(stderr) + (["output_limit"] if overflow else [])
        self._record_limits(hits, cmd)
        if overflow:
            stderr += f"\n[output exceeded {limit} bytes on {', '.join(overflow)}; process killed]"
            returncode = returncode if returncode not in (0, None) else 1
        return ExecResult(success=returncode == 0, returncode=returncode, stdout=stdout, stderr=stderr)

    # ------------------------------------------------------------- files
    def host_path(self, file: str) -> Path:
        """Map a sandbox path (relative, /workspace/..., /tmp/...) to the host; refuse anything else."""
        if not file.startswith("/"):
            base, rest = self.workspace, file
        elif file == WORKSPACE or file.startswith(WORKSPACE + "/"):
            base, rest = self.workspace, file[len(WORKSPACE) :].lstrip("/")
        elif file == "/tmp" or file.startswith("/tmp/"):
            base, rest = self.tmp, file[len("/tmp") :].lstrip("/")
        else:
            raise PermissionError(f"{file}: only /workspace and /tmp are reachable from the host")
        candidate = (base / rest).resolve()  # follows symlinks the sandbox may have planted
        if candidate != base and base not in candidate.parents:
            raise PermissionError(f"{file}: resolves outside the sandbox")
        return candidate

    async def write_file(self, file: str, contents: str | bytes) -> None:
        path = self.host_path(file)
        if path.is_dir():
            raise IsADirectoryError(file)
        data = contents.encode() if isinstance(contents, str) else contents
        created = []
        for parent in reversed([path.parent, *path.parent.parents]):
            if not parent.exists():
                parent.mkdir()
                created.append(parent)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        if self.uid is not None:
            for item in [*created, path]:
                os.chown(item, self.uid, self.uid, follow_symlinks=False)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        from inspect_ai.util._sandbox.limits import verify_read_file_size

        path = self.host_path(file)
        if path.is_dir():
            raise IsADirectoryError(file)
        if not path.exists():
            raise FileNotFoundError(file)
        verify_read_file_size(str(path))
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            data = handle.read()
        return data.decode("utf-8") if text else data


@contextlib.asynccontextmanager
async def bwrap_sandbox(config: BwrapConfig | None = None) -> AsyncIterator[BwrapSandboxEnvironment]:
    """A bwrap sandbox outside an Inspect eval (post-training rollouts, benchmarks); always cleaned up."""
    environment = BwrapSandboxEnvironment(config or BwrapConfig())
    try:
        yield environment
    finally:
        await asyncio.shield(environment.close())
