"""Process lifecycle: SIGTERM and SIGINT end a command cleanly; a second signal forces the exit.

SIGTERM is how systemd, Kubernetes and ``docker stop`` end a process; SIGINT is Ctrl-C. Both become
:class:`Stop` (a ``KeyboardInterrupt``) raised in the main thread, so every command unwinds through the
``finally`` blocks and checkpoint paths it already has for Ctrl-C. A second signal while that clean-up runs
kills every process this one started (Ray's node, engines, workers) and exits at once.

Ray replaces the driver's SIGTERM handler when it connects: ``ray.init`` installs a Python ``sys.exit`` and
its core worker installs a C++ failure-signal handler that prints a stack trace and aborts. :func:`init_ray`
connects and then puts the caller's handlers back (ours, or a trainer's stop-after-this-step); every
``ray.init`` of a command goes through it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stop(KeyboardInterrupt):
    """A stop signal (SIGTERM or SIGINT) arrived; raised in the main thread."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM)."""
        return 128 + self.signum


class _State:
    received: list[int] = []


def install() -> None:
    """Route SIGTERM and SIGINT to :class:`Stop` (the first) and a forced exit (the second).

    Only the main thread may set signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in SIGNALS:
        signal.signal(signum, _handle)


def _handle(signum: int, frame: Any) -> None:
    if _State.received:
        _force(signum)
    _State.received.append(signum)
    raise Stop(signum)


def _force(signum: int) -> None:
    sys.stderr.write(f"\nsecond {signal.Signals(signum).name}: stopping now\n")
    sys.stderr.flush()
    kill_descendants(grace_s=2.0)
    os._exit(128 + signum)


def kill_descendants(grace_s: float = 5.0) -> int:
    """Terminate every process this one started (recursively), then kill what is left after ``grace_s``.

    Returns how many were running.
    """
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for child in children:
        try:
            child.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return len(children)


@contextlib.contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """Put this process's SIGTERM/SIGINT handlers back after the block, whatever it installed (Ray does)."""
    saved = {signum: signal.getsignal(signum) for signum in SIGNALS}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set them
            for signum, handler in saved.items():
                if handler is not None:  # None: installed outside Python, nothing to put back
                    signal.signal(signum, handler)


def init_ray(**kwargs: Any) -> None:
    """``ray.init(**kwargs)``, keeping the caller's SIGTERM/SIGINT handlers (see the module docstring)."""
    import ray

    with keep_signal_handlers():
        ray.init(**kwargs)
