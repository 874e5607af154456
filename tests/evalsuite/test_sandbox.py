"""Escape attempts against the bwrap sandbox: each must be contained and leave the host unaffected."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from evalsuite.families.terminal.verifier import verify_terminal_in_sandbox
from evalsuite.generators import generate_instance, task_types
from evalsuite.sandbox import BwrapConfig, BwrapSandboxEnvironment, bwrap_available, bwrap_sandbox

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (bwrap) not usable here")

SMALL = BwrapConfig(
    wall_timeout=5, cpu_seconds=3, memory_bytes=512 << 20, max_processes=48, max_file_bytes=1 << 20,
    output_limit_bytes=64 << 10,
)  # fmt: skip


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def host_processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_exec_files_and_layout() -> None:
    async def body() -> None:
        async with bwrap_sandbox(SMALL) as box:
            await box.write_file("dir/in.txt", "hello")
            result = await box.exec(
                ["bash", "--login", "-c", "cat dir/in.txt; pwd; cat > out.txt"], input="piped"
            )
            assert result.success and result.stdout.startswith("hello/workspace")
            assert await box.read_file("out.txt") == "piped"
            assert await box.read_file("/workspace/out.txt", text=False) == b"piped"
            await box.exec(["bash", "-c", "echo t > /tmp/x"])
            assert (await box.read_file("/tmp/x")).strip() == "t"
            with pytest.raises(FileNotFoundError):
                await box.read_file("missing.txt")
            root = box.root
        assert not root.exists()

    run(body())


def test_network_is_unreachable() -> None:
    async def body() -> None:
        async with bwrap_sandbox(SMALL) as box:
            code = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)"
            result = await box.exec(["python3", "-c", code])
            assert not result.success and "unreachable" in result.stderr.lower()
            result = await box.exec(["bash", "-c", "cat /proc/net/dev | tail -n +3 | cut -d: -f1"])
            assert result.stdout.split() == ["lo"]

    run(body())


def test_cannot_write_outside_or_read_host_home(tmp_path: Path) -> None:
    marker = tmp_path / "host-file"
    marker.write_text("secret")

    async def body() -> None:
        async with bwrap_sandbox(SMALL) as box:
            script = (
                f"echo pwned > /usr/pwned; echo pwned > /etc/pwned; echo pwned > {marker}; ls /root; "
                f"cat {marker}; cat /etc/shadow; ls {Path.home()}"
            )
            result = await box.exec(["bash", "-c", script])
            assert "secret" not in result.stdout and "root:" not in result.stdout
            assert "Read-only file system" in result.stderr
            # paths handed to the host side cannot leave the tree, even through a planted symlink
            await box.exec(["bash", "-c", "ln -s /etc/passwd link; ln -s / rootlink"])
            for path in ("../../etc/passwd", "/etc/passwd", "link", "rootlink/etc/hostname"):
                with pytest.raises(PermissionError):
                    await box.read_file(path)
            with pytest.raises(PermissionError):
                await box.write_file("rootlink/tmp/evil", "x")

    run(body())
    assert marker.read_text() == "secret"
    assert not Path("/usr/pwned").exists() and not Path("/etc/pwned").exists()


def test_fork_bomb_is_contained() -> None:
    async def body() -> None:
        async with bwrap_sandbox(SMALL) as box:
            started = time.monotonic()
            try:
                await box.exec(
                    ["bash", "-c", "f(){ f | f & }; f; sleep 1; echo tandem-forkbomb-done"], timeout=4
                )
            except TimeoutError:
                pass
            assert time.monotonic() - started < 8
            ok = await box.exec(["bash", "-c", "echo alive"])
            assert ok.stdout.strip() == "alive"

    run(body())
    assert subprocess.run(["true"]).returncode == 0


def test_memory_limit() -> None:
    async def body() -> None:
        async with bwrap_sandbox(SMALL) as box:
            result = await box.exec(["python3", "-c", "x = bytearray(10 * 1024**3); print('allocated')"])
            assert not result.success and "allocated" not in result.stdout and "MemoryError" in result.stderr

    run(body())


def test_run_forever_times_out_and_leaves_nothing_behind() -> None:
    async def body() -> None:
        async with bwrap_sandbox(SMALL) as box:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await box.exec(["bash", "-c", "sleep 4242 & exec sleep 4243"], timeout=1)
            assert time.monotonic() - started < 3
        # cpu-bound code is stopped by RLIMIT_CPU (1 s here) well before the wall timeout
        async with bwrap_sandbox(SMALL.model_copy(update={"cpu_seconds": 1, "wall_timeout": 20})) as box:
            result = await box.exec(["python3", "-c", "while True: pass"])
            assert not result.success and result.returncode != 0

    run(body())
    time.sleep(0.3)
    assert host_processes("sleep 424") == []


def test_huge_output_is_capped_quickly() -> None:
    async def body() -> None:
        async with bwrap_sandbox(SMALL) as box:
            started = time.monotonic()
            result = await box.exec(["bash", "-c", "head -c 1000000000 /dev/zero | tr '\\0' x"])
            assert time.monotonic() - started < 3
            assert len(result.stdout) == SMALL.output_limit_bytes and not result.success
            assert "exceeded" in result.stderr
            big = await box.exec(["bash", "-c", "head -c 5000000 /dev/zero > big.bin; stat -c %s big.bin"])
            assert int(big.stdout.strip() or 0) <= SMALL.max_file_bytes

    run(body())


def test_cancellation_kills_the_process_and_cleanup_removes_the_tree() -> None:
    async def body() -> None:
        box = BwrapSandboxEnvironment(SMALL)
        task = asyncio.create_task(box.exec(["bash", "-c", "exec sleep 4244"]))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await BwrapSandboxEnvironment.sample_cleanup("t", SMALL, {"default": box}, interrupted=True)
        assert not box.root.exists()

    run(body())
    time.sleep(0.3)
    assert host_processes("sleep 4244") == []


def test_snapshot_is_copied_fresh_per_sample(tmp_path: Path) -> None:
    (tmp_path / "seed.txt").write_text("v1")

    async def body() -> None:
        config = SMALL.model_copy(update={"snapshot_dir": str(tmp_path)})
        async with bwrap_sandbox(config) as first:
            await first.exec(["bash", "-c", "echo changed > seed.txt"])
            assert (await first.read_file("seed.txt")).strip() == "changed"
        async with bwrap_sandbox(config) as second:
            assert await second.read_file("seed.txt") == "v1"

    run(body())
    assert (tmp_path / "seed.txt").read_text() == "v1"


@pytest.mark.parametrize(
    "task_type", ["count_matches", "sort_unique", "extract_column", "rename_files", "fix_bug"]
)
def test_reference_solutions_pass_and_untouched_workspaces_fail(task_type: str) -> None:
    assert task_type in task_types("terminal")

    async def body() -> None:
        for difficulty in ("easy", "medium", "hard"):
            instance = generate_instance("terminal", task_type, difficulty, seed=7)  # type: ignore[arg-type]
            for solve in (True, False):
                async with bwrap_sandbox(SMALL) as box:
                    for path, contents in instance.files.items():
                        await box.write_file(path, contents)
                    if solve:
                        await box.exec(["bash", "-c", instance.expected["reference_solution"]])
                    result = await verify_terminal_in_sandbox(instance, box)
                    assert result.correct is solve, (difficulty, solve, result.explanation)

    run(body())


def test_runs_as_unprivileged_uid_when_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("only meaningful when the host runs as root")

    async def body() -> None:
        async with bwrap_sandbox(SMALL) as box:
            assert (await box.exec(["id", "-u"])).stdout.strip() != "0"

    run(body())


def test_registered_with_inspect() -> None:
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    import evalsuite._registry  # noqa: F401  (what the inspect_ai entry point loads)

    assert registry_find_sandboxenv("bwrap") is BwrapSandboxEnvironment
