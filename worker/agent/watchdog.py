"""Kills an attempt's process group when the agent that started it dies.

Run as `python -m flightdeck.worker.agent.watchdog AGENT_PID PGID GRACE`, in its own session, so a
kill -9 of the agent never leaves torchrun and its ranks holding GPUs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import psutil

from flightdeck.worker.agent.terminate import terminate

POLL_SECONDS = 0.25


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(pgid: int) -> list[psutil.Process]:
    """torchrun's ranks run in sessions of their own: the group signal alone misses them."""
    try:
        return psutil.Process(pgid).children(recursive=True)
    except psutil.Error:
        return []


def _signal(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def kill_group(pgid: int, grace: float) -> None:
    """SIGTERM the group and every descendant, wait up to `grace` seconds, then SIGKILL what is left."""
    try:
        leader = [psutil.Process(pgid)]
    except psutil.Error:
        leader = []
    terminate([*leader, *descendants(pgid)], grace, group=pgid)


def watch(agent_pid: int, pgid: int, grace: float) -> None:
    # Ctrl-C in the agent's terminal must not stop the guard before the agent decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: list[psutil.Process] = []
    while group_alive(pgid):
        # Remember the ranks while torchrun lives: once it dies they are reparented away from it.
        children = descendants(pgid) or children
        # Reparenting means the agent is gone; pid reuse cannot fool this check.
        if os.getppid() != agent_pid:
            kill_group(pgid, grace)
            return
        time.sleep(POLL_SECONDS)
    # torchrun is gone (killed with the agent's group?) but its ranks may not be.
    _signal([c for c in children if c.is_running()], signal.SIGKILL)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
