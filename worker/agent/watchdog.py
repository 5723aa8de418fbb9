"""Kills an attempt's process group when the agent that started it dies.

Run as `python -m worker.agent.watchdog AGENT_PID PGID GRACE`, in its own session, so a
kill -9 of the agent never leaves torchrun and its ranks holding GPUs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

POLL_SECONDS = 0.25


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace: float) -> None:
    """SIGTERM the group, wait up to `grace` seconds, then SIGKILL what is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def watch(agent_pid: int, pgid: int, grace: float) -> None:
    # Ctrl-C in the agent's terminal must not stop the guard before the agent decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while group_alive(pgid):
        # Reparenting means the agent is gone; pid reuse cannot fool this check.
        if os.getppid() != agent_pid:
            kill_group(pgid, grace)
            return
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
