"""H008: a script that ended on every rank but whose processes do not exit (hung in teardown).

An instrumented rank writes `script-end-rank<N>.json` when its main script returns, and holds
`leaving-rank<N>.json` while it is inside destroy_process_group() (worker/instrument/script_end.py).
Once every rank of this node has ended or is leaving, the run trained to its end: a process still
alive `teardown_grace_seconds` later is waiting in teardown (a process group, loader workers, a
non-daemon thread), not stalled. The agent dumps its stack, ends it, and the attempt succeeds with a
warning naming the rank.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from flightdeck.worker.agent.process import rank_processes
from flightdeck.worker.instrument import END_MARKER_PREFIX, LEAVING_MARKER_PREFIX

# The instrumented ranks dump every thread's stack on this signal (faulthandler, worker/instrument/hooks.py).
STACK_SIGNAL = signal.SIGUSR1
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)', re.MULTILINE)


class TeardownWatch:
    """Sees the end of the script on every rank of this node, then how long its processes outlive it."""

    def __init__(
        self, run_dir: Path, ranks: int, grace: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.run_dir = run_dir
        self.ranks = ranks
        self.grace = grace
        self.clock = clock
        self.ended_at: float | None = None
        self.said = False

    def ended_now(self) -> bool:
        """True once, when the last rank has ended or is leaving its process group (the grace starts
        then, and again after a rank that left went back to work)."""
        if self.ended_at is not None or not self._all_done():
            return False
        self.ended_at = self.clock()
        first, self.said = not self.said, True
        return first

    def overdue(self) -> bool:
        if self.ended_at is None:
            return False
        if not self._all_done():
            # A rank's destroy_process_group() returned and its script goes on (a save after leaving
            # the group): it is working again, and the grace starts over when it is done.
            self.ended_at = None
            return False
        return self.clock() - self.ended_at >= self.grace

    def _all_done(self) -> bool:
        done = {self._rank(p.name) for p in self.run_dir.glob(f"{END_MARKER_PREFIX}*.json")}
        done |= {self._rank(p.name) for p in self.run_dir.glob(f"{LEAVING_MARKER_PREFIX}*.json")}
        return len(done) >= self.ranks

    @staticmethod
    def _rank(name: str) -> str:
        return name.removesuffix(".json").rpartition("rank")[2]


def live_ranks(processes: list[psutil.Process]) -> list[tuple[int, int]]:
    """(rank, pid) of each living instrumented rank (rank_processes: not its DataLoader workers)."""
    found = []
    for proc in rank_processes(processes):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if "RANK" in env and env.get("FLIGHTDECK_INSTRUMENT") == "1":
            found.append((int(env["RANK"]), proc.pid))
    return sorted(found)


def dump_stacks(pids: list[int]) -> None:
    """Ask the ranks to write their threads' stacks into the log (faulthandler)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, STACK_SIGNAL)


def innermost_frames(log_text: str, count: int = 3) -> list[str]:
    """The last dumped stack's innermost frames ('file:line in function'), for the warning."""
    start = log_text.rfind("(most recent call first):")
    if start < 0:
        return []
    return [f"{Path(f).name}:{line} in {fn}" for f, line, fn in _FRAME.findall(log_text[start:])[:count]]
