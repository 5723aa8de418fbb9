"""H008: a run that ended on every rank but whose processes do not exit (hung in teardown).

An instrumented rank writes `script-end-rank<N>.json` when its main script returns, and holds
`leaving-rank<N>.json` while it is inside destroy_process_group() (worker/instrument/script_end.py);
the recipe trainer's ranks write the same once past their last barrier with the result written, and
while they destroy their group (worker/train/exit_status.py): the trainer then exits at once, so what
hangs there is NCCL's destroy or torchrun itself (its exit barrier waits for the other nodes' agents).
Once every rank of this node has ended or is leaving, the run trained to its end: a process still
alive `teardown_grace_seconds` later is waiting in teardown (a process group, loader workers, a
non-daemon thread), not stalled. The agent dumps its stack, ends it, and the attempt succeeds with a
warning naming the rank.

A rank can also hang before its script returns, in a destructor run as its main function returns (a
process group torch tears down holding the GIL while its thread waits for it): no marker comes. So once
some rank's script has ended, a rank without a marker that uses next to no CPU for the whole grace is
counted as ended too (a rank still working, even alone, keeps its CPU busy), and the grace runs from
when the idle stretch began.

A bare launch (`entrypoint.instrument: false`) writes no marker, so its end is read from what the agent
sees without the script's help: a rank that was seen and has exited (torchrun ends every rank at once
when one fails, so a rank gone while the others live ended its script), or the HF Trainer's
end-of-training summary line in the log (`{'train_runtime': ...}`: every Trainer prints it as
`train()` returns). The ranks still alive are then judged the same way: idle for the whole grace, they
are counted as ended. Without this, a bare run that deadlocks as it returns hangs until cancelled (no
metrics reach the service live, so no stall watch sees it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from flightdeck.contracts import STACKS_DIR
from flightdeck.run_variables import INSTRUMENT_VARIABLE
from flightdeck.worker.agent.process import rank_processes
from flightdeck.worker.instrument import END_MARKER_PREFIX, LEAVING_MARKER_PREFIX

# The instrumented ranks dump every thread's stack on this signal (faulthandler, worker/instrument/hooks.py).
STACK_SIGNAL = signal.SIGUSR1
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)', re.MULTILINE)


# A rank left behind is idle while its CPU time grows by less than this share of the wall time.
IDLE_CPU_SHARE = 0.05

# The HF Trainer's end-of-training summary, as its log callbacks print it (`str(dict)`).
_TRAINER_END = re.compile(r"\{['\"]train_runtime['\"]: ")
# How often a bare run's log is read for that line.
_LOG_READ_SECONDS = 5.0


class TrainerEndInLog:
    """Whether the run's log holds the Trainer's end-of-training summary; once seen it stays seen. The
    log's tail is read at most every `_LOG_READ_SECONDS` (the agent polls twice a second)."""

    def __init__(self, read_tail: Callable[[], str], clock: Callable[[], float] = time.monotonic) -> None:
        self.read_tail = read_tail
        self.clock = clock
        self.seen = False
        self._read_at: float | None = None

    def __call__(self) -> bool:
        if self.seen:
            return True
        now = self.clock()
        if self._read_at is None or now - self._read_at >= _LOG_READ_SECONDS:
            self._read_at = now
            self.seen = _TRAINER_END.search(self.read_tail()) is not None
        return self.seen


class TeardownWatch:
    """Sees the end of the script on every rank of this node, then how long its processes outlive it.

    `rank_cpu` gives the CPU seconds of each live rank of this node (by rank): with it, a rank without
    a marker that stays idle for the grace after another rank's script ended counts as ended.
    `bare_end` is for a run with no markers (a bare launch): whether its log says training ended. Its
    ranks are then watched from the start, and a rank that exits counts as a script that ended.
    """

    def __init__(
        self,
        run_dir: Path,
        ranks: int,
        grace: float,
        clock: Callable[[], float] = time.monotonic,
        rank_cpu: Callable[[], dict[int, float]] | None = None,
        bare_end: Callable[[], bool] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.ranks = ranks
        self.grace = grace
        self.clock = clock
        self.rank_cpu = rank_cpu
        self.ended_at: float | None = None
        self.said = False
        # Ranks left behind: since when each has been idle, and its CPU seconds then.
        self._idle_since: dict[int, tuple[float, float]] = {}
        self.left_behind: list[int] = []  # the ranks counted as ended because they sat idle
        self.bare_end = bare_end
        self._seen: set[int] = set()  # a bare run's ranks seen alive
        self.exited: list[int] = []  # a bare run's ranks that exited while others lived

    def ended_now(self) -> bool:
        """True once, when the last rank has ended or is leaving its process group (the grace starts
        then, and again after a rank that left went back to work)."""
        if self.ended_at is not None:
            return False
        if self._all_done():
            self.ended_at = self.clock()
        else:
            idle_from = self._left_behind_since()
            if idle_from is None:
                return False
            self.ended_at = idle_from  # the grace has already run while they sat idle
        first, self.said = not self.said, True
        return first

    def overdue(self) -> bool:
        if self.ended_at is None:
            return False
        if self.left_behind:
            return self.clock() - self.ended_at >= self.grace
        if not self._all_done():
            # A rank's destroy_process_group() returned and its script goes on (a save after leaving
            # the group): it is working again, and the grace starts over when it is done.
            self.ended_at = None
            return False
        return self.clock() - self.ended_at >= self.grace

    def exit_code(self) -> int:
        """The code the ranks said they exit with (the recipe trainer's 42 after a health stop, 43 after a
        signal's checkpoint); 0 when none said another (a script's markers carry 0)."""
        for path in sorted(self.run_dir.glob(f"{END_MARKER_PREFIX}*.json")):
            try:
                code = json.loads(path.read_text()).get("exit_code", 0)
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(code, int) and not isinstance(code, bool) and code != 0:
                return code
        return 0

    def finished_everywhere(self) -> bool:
        """Every rank of this node wrote its end marker (its script returned, or the trainer passed its
        last barrier) and none said it exits with another code than 0: a process that dies after that
        died in teardown."""
        return len(self._ended()) >= self.ranks and self.exit_code() == 0

    def _all_done(self) -> bool:
        return len(self._ended() | self._leaving()) >= self.ranks

    def _ended(self) -> set[str]:
        return {self._rank(p.name) for p in self.run_dir.glob(f"{END_MARKER_PREFIX}*.json")}

    def _leaving(self) -> set[str]:
        return {self._rank(p.name) for p in self.run_dir.glob(f"{LEAVING_MARKER_PREFIX}*.json")}

    def _left_behind_since(self) -> float | None:
        """When the live ranks without a marker all became idle, once some rank's script has ended and
        they have stayed idle for the grace since; None otherwise (idleness is measured again)."""
        ended = self._ended()
        if self.rank_cpu is None or not (ended or self.bare_end is not None):
            self._idle_since.clear()
            return None
        now = self.clock()
        marked = ended | self._leaving()
        cpu_now = self.rank_cpu()
        if not ended:  # a bare run: a rank that exited, or the log saying training ended
            self._seen |= set(cpu_now)
            self.exited = sorted(self._seen - set(cpu_now))
            if not self.exited and not (self.bare_end is not None and self.bare_end()):
                self._idle_since.clear()
                return None
        behind = {rank: cpu for rank, cpu in cpu_now.items() if str(rank) not in marked}
        if not behind:
            return None
        for rank, cpu in behind.items():
            since = self._idle_since.get(rank)
            if since is None or cpu - since[1] > IDLE_CPU_SHARE * max(now - since[0], 1.0):
                self._idle_since[rank] = (now, cpu)  # working (or first seen): idle from now at most
        for rank in list(self._idle_since):
            if rank not in behind:
                del self._idle_since[rank]
        start = max(since for since, _ in self._idle_since.values())
        if now - start < self.grace:
            return None
        self.left_behind = sorted(behind)
        return start

    @staticmethod
    def _rank(name: str) -> str:
        return name.removesuffix(".json").rpartition("rank")[2]


def live_ranks(processes: list[psutil.Process], instrumented: bool = True) -> list[tuple[int, int]]:
    """(rank, pid) of each living rank (rank_processes: not its DataLoader workers); with `instrumented`,
    only ranks the launch instrumented."""
    found = []
    for proc in rank_processes(processes):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if "RANK" in env and (not instrumented or env.get(INSTRUMENT_VARIABLE) == "1"):
            found.append((int(env["RANK"]), proc.pid))
    return sorted(found)


def rank_cpu_seconds(processes: list[psutil.Process], instrumented: bool = True) -> dict[int, float]:
    """CPU seconds (user and system) of each living rank, by rank (see live_ranks)."""
    found = {}
    for rank, pid in live_ranks(processes, instrumented):
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        found[rank] = times.user + times.system
    return found


def dump_stacks(pids: list[int]) -> None:
    """Ask the ranks to write their threads' stacks into the log (faulthandler)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, STACK_SIGNAL)


def trainer_dumps(run_dir: Path, ranks: list[tuple[int, int]]) -> str:
    """What the recipe trainer's live ranks dumped on STACK_SIGNAL: each writes its own file
    (worker/train/stack_dumps.py), not the log; the first rank's last, for innermost_frames."""
    for rank, _ in ranks[:1]:
        with contextlib.suppress(OSError):
            return (run_dir / STACKS_DIR / f"rank-{rank}.txt").read_text(errors="replace")
    return ""


def innermost_frames(log_text: str, count: int = 3) -> list[str]:
    """The last dumped stack's innermost frames ('file:line in function'), for the warning."""
    start = log_text.rfind("(most recent call first):")
    if start < 0:
        return []
    return [f"{Path(f).name}:{line} in {fn}" for f, line, fn in _FRAME.findall(log_text[start:])[:count]]
