"""Stopping a tree of processes: SIGTERM, a grace period, SIGKILL for what is left (psutil.wait_procs).

The one implementation behind cancel (worker/agent/process.py), the watchdog that outlives a killed
agent (worker/agent/watchdog.py) and the benchmarks' servers (bench/harness.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence

import psutil


def terminate(
    processes: Sequence[psutil.Process],
    grace: float,
    *,
    group: int | None = None,
    child: subprocess.Popen[bytes] | None = None,
    kill_wait: float = 10.0,
) -> list[psutil.Process]:
    """SIGTERM every process (and the process `group`), wait up to `grace` seconds for all of them,
    SIGKILL the survivors and wait up to `kill_wait` more. Returns the processes still alive.

    `child`: our own child among them, waited for through Popen so its exit code is not lost (psutil
    would reap it behind Popen's back).
    """
    others = [p for p in processes if child is None or p.pid != child.pid]
    _send(others, signal.SIGTERM, group, child)
    alive = _wait(others, grace, child)
    if alive:
        _send(alive, signal.SIGKILL, group, child)
        alive = _wait(alive, kill_wait, child)
    return alive


def _send(
    processes: Sequence[psutil.Process], sig: int, group: int | None, child: subprocess.Popen[bytes] | None
) -> None:
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
    if child is not None and child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(sig)
    for process in processes:  # ranks in sessions of their own miss the group signal
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def _wait(
    processes: Sequence[psutil.Process], timeout: float, child: subprocess.Popen[bytes] | None
) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    _, alive = psutil.wait_procs(list(processes), timeout=timeout)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(max(0.0, deadline - time.monotonic()))
        if child.poll() is None:
            with contextlib.suppress(psutil.Error):
                alive.append(psutil.Process(child.pid))
    return list(alive)
