"""Where each rank is: every live rank's Python stack, named rank by rank (H006).

When a run stalls (H003) or is stopped, the agent reads each rank's stack with py-spy, which needs no
cooperation from the process (a user's script, a rank stopped with SIGSTOP: `--nonblocking` reads a
stopped process's memory without suspending it). Ranks the trainer runs also dump their own stack with
faulthandler on SIGUSR1 (the fallback when py-spy is missing) and on SIGTERM (so when torchrun tears the
survivors down after a rank died, H005, their last place is on disk).

The place of a rank is its innermost frame and the first frame of the user's own code: "rank 0 in
`evaluate()` at train.py:57; rank 1 in `barrier` (torch/distributed/distributed_c10d.py:4811) from
`main()` at train.py:80". Ranks in the same place are grouped ("ranks 1-3 in ...").
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from flightdeck.contracts import FLIGHT_RECORDER_PREFIX, STACKS_DIR

PY_SPY_TIMEOUT_SECONDS = 5.0
FAULTHANDLER_WAIT_SECONDS = 2.0
_PY_SPY_FRAME = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
_FAULT_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+)$')
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "<frozen ")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def is_library(self) -> bool:
        if any(marker in self.file for marker in _LIBRARY_MARKERS):
            return True
        stdlib = os.path.join(sys.base_prefix, "lib")
        return self.file.startswith(stdlib)

    def short_file(self, workspace: str | None) -> str:
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in self.file:
                return self.file.split(marker, 1)[1]
        if workspace and self.file.startswith(workspace.rstrip("/") + "/"):
            return self.file[len(workspace.rstrip("/")) + 1 :]
        return os.path.basename(self.file)


@dataclass
class RankStack:
    """One rank's stack: the main thread's frames, innermost first, and the dump they came from."""

    rank: int
    pid: int
    source: str  # py-spy, faulthandler, or why there is none
    text: str = ""
    frames: list[Frame] = field(default_factory=list)

    def place(self, workspace: str | None = None) -> str:
        if not self.frames:
            return f"at an unknown place ({self.source})"
        inner = self.frames[0]
        own = next((f for f in self.frames if not f.is_library), None)
        if own is inner:
            return f"in `{inner.function}()` at {inner.short_file(workspace)}:{inner.line}"
        where = f"in `{inner.function}` ({inner.short_file(workspace)}:{inner.line})"
        if own is not None:
            where += f" from `{own.function}()` at {own.short_file(workspace)}:{own.line}"
        return where


def parse_py_spy(text: str) -> list[Frame]:
    """The main thread's frames of a `py-spy dump` (the first thread block, or the one named
    MainThread), innermost first."""
    blocks: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        if line.startswith("Thread "):
            blocks.append((line, []))
        elif blocks and (match := _PY_SPY_FRAME.match(line)):
            blocks[-1][1].append(Frame(match["function"], match["file"], int(match["line"])))
    main = next((frames for header, frames in blocks if "MainThread" in header), None)
    return main if main is not None else (blocks[0][1] if blocks else [])


def parse_faulthandler(text: str) -> list[Frame]:
    """The last dump's current thread (faulthandler: 'Current thread 0x... (most recent call first)');
    the first thread when none is marked current (a dump from a signal handler thread)."""
    dumps = [chunk for chunk in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text) if chunk.strip()]
    if not dumps:
        return []
    # A file may hold several dumps (SIGUSR1, then SIGTERM): the last starts at its last 'Current thread'.
    current = [d for d in dumps if d.lstrip().startswith("Current thread")]
    chosen = current[-1] if current else dumps[-1]
    frames = []
    for line in chosen.splitlines():
        match = _FAULT_FRAME.match(line)
        if match:
            frames.append(Frame(match["function"], match["file"], int(match["line"])))
    return frames


def rank_processes(processes: list[psutil.Process]) -> list[tuple[int, psutil.Process]]:
    """The ranks among an attempt's processes: RANK in their environment (torchrun sets it), their
    parent without (a DataLoader worker inherits RANK from its rank)."""
    ranks: dict[int, psutil.Process] = {}
    environments: dict[int, dict[str, str]] = {}
    for proc in processes:
        try:
            environments[proc.pid] = proc.environ()
        except psutil.Error:
            continue
    for proc in processes:
        env = environments.get(proc.pid, {})
        if "RANK" not in env or not env["RANK"].isdigit():
            continue
        try:
            parent = proc.ppid()
        except psutil.Error:
            continue
        if "RANK" in environments.get(parent, {}):
            continue
        ranks[int(env["RANK"])] = proc
    return sorted(ranks.items())


def py_spy_dump(pid: int) -> tuple[str | None, str]:
    """(the dump, '') or (None, why not). A stopped process is read without suspending it."""
    binary = shutil.which("py-spy") or _beside_interpreter("py-spy")
    if binary is None:
        return None, "py-spy is not installed"
    why = ""
    for extra in ([], ["--nonblocking"]):
        try:
            done = subprocess.run(
                [binary, "dump", "--full-filenames", *extra, "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=PY_SPY_TIMEOUT_SECONDS,
            )
        except subprocess.TimeoutExpired:
            why = "py-spy timed out"
            continue
        if done.returncode == 0 and "Thread " in done.stdout:
            return done.stdout, ""
        why = (done.stderr.strip().splitlines() or [f"py-spy exited {done.returncode}"])[0]
    return None, why


def _beside_interpreter(name: str) -> str | None:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() else None


def faulthandler_file(run_dir: Path, rank: int) -> Path:
    return run_dir / STACKS_DIR / f"rank-{rank}.txt"


def faulthandler_dump(run_dir: Path, rank: int, pid: int) -> str | None:
    """Ask a trainer rank for its own stack (SIGUSR1, registered by flightdeck.worker.train); only a rank whose
    file exists registered the handler (SIGUSR1 would end any other process)."""
    path = faulthandler_file(run_dir, rank)
    if not path.is_file():
        return None
    before = path.stat().st_size
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        return None
    deadline = time.monotonic() + FAULTHANDLER_WAIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if path.stat().st_size > before:
            time.sleep(0.1)  # the handler writes in a few calls
            return path.read_text(errors="replace")[before:]
    return None


def take_rank_stacks(
    processes: list[psutil.Process], run_dir: Path, *, use_py_spy: bool = True
) -> list[RankStack]:
    """Every live rank's stack: py-spy first, the trainer's faulthandler as the fallback; the ranks are
    read side by side, so a stop waits for the slowest rank, not for the sum of them."""

    def one(rank: int, proc: psutil.Process) -> RankStack:
        text, why = py_spy_dump(proc.pid) if use_py_spy else (None, "py-spy not used")
        if text is not None:
            return RankStack(rank, proc.pid, "py-spy", text, parse_py_spy(text))
        dumped = faulthandler_dump(run_dir, rank, proc.pid)
        if dumped:
            return RankStack(rank, proc.pid, "faulthandler", dumped, parse_faulthandler(dumped))
        return RankStack(rank, proc.pid, why or "no stack could be read")

    ranks = rank_processes(processes)
    if not ranks:
        return []
    with ThreadPoolExecutor(max_workers=min(len(ranks), 16), thread_name_prefix="rank-stack") as pool:
        return list(pool.map(lambda item: one(*item), ranks))


def stacks_left_on_disk(run_dir: Path) -> list[RankStack]:
    """The stacks trainer ranks dumped themselves when torchrun ended them (SIGTERM after a rank died)."""
    stacks = []
    for path in sorted((run_dir / STACKS_DIR).glob("rank-*.txt")):
        text = path.read_text(errors="replace")
        rank = path.stem.removeprefix("rank-")
        frames = parse_faulthandler(text)
        # A rank already exiting on its own error (gloo sees a dead peer at once) has no Python frame
        # left: its own traceback in the log says where it was.
        if frames and rank.isdigit():
            stacks.append(RankStack(int(rank), 0, "faulthandler", text, frames))
    return sorted(stacks, key=lambda s: s.rank)


def _ranks_label(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def summarize(stacks: list[RankStack], workspace: str | None = None) -> str:
    """'rank 0 in `evaluate()` at train.py:57; rank 1 in `barrier` (...) from `main()` at train.py:80'."""
    places: dict[str, list[int]] = {}
    for stack in stacks:
        places.setdefault(stack.place(workspace), []).append(stack.rank)
    return "; ".join(f"{_ranks_label(ranks)} {place}" for place, ranks in places.items())


def ranks_apart(stacks: list[RankStack], workspace: str | None = None) -> bool:
    """The ranks are in different places (H006): one busy alone while the others wait."""
    known = {s.place(workspace) for s in stacks if s.frames}
    return len(known) > 1


def full_dumps(stacks: list[RankStack]) -> str:
    """Every rank's whole dump, for the log (stored with the attempt as log chunks)."""
    parts = [
        f"[flightdeck] stack of rank {s.rank} (pid {s.pid}, {s.source}):\n{s.text.rstrip()}" for s in stacks
    ]
    return "\n".join(parts) + "\n"


H006_FIX = (
    "one rank is busy alone (evaluating, tokenising, saving on rank 0) while the others wait in a "
    "collective until the timeout: run that work on every rank, before the process group starts, or "
    "outside the collective's way (the Trainer's own evaluation and saving do); every rank's whole stack "
    "is in the log"
)


@dataclass
class RanksReport:
    """Where the ranks were, said once: the summary for the failure, an event, the dumps in the log."""

    stacks: list[RankStack]
    summary: str
    apart: bool
    flight_recorder: list[str]

    def event(self, moment: str) -> dict[str, object]:
        from flightdeck.contracts import attempt_event

        return attempt_event(
            f"stacks:{moment}",
            "health",
            f"where the ranks were {moment}: {self.summary}",
            code="H006" if self.apart else None,
            severity="warn" if self.apart else "info",
            fix=H006_FIX if self.apart else None,
            data={
                "ranks": [
                    {
                        "rank": s.rank,
                        "pid": s.pid,
                        "source": s.source,
                        "frames": [f"{f.function} ({f.file}:{f.line})" for f in s.frames[:20]],
                    }
                    for s in self.stacks
                ],
                "flight_recorder": self.flight_recorder,
            },
        )


def ranks_report(stacks: list[RankStack], run_dir: Path, workspace: str | None) -> RanksReport | None:
    """Summarise `stacks` and append every whole dump to the run's log (shipped with the attempt)."""
    from flightdeck.contracts import LOG_FILE

    if not stacks:
        return None
    recorder = sorted(p.name for p in run_dir.glob(f"{FLIGHT_RECORDER_PREFIX}*"))
    report = RanksReport(stacks, summarize(stacks, workspace), ranks_apart(stacks, workspace), recorder)
    try:
        with open(run_dir / LOG_FILE, "a", encoding="utf-8") as log:
            log.write(f"[flightdeck] where the ranks were: {report.summary}\n")
            log.write(full_dumps(stacks))
            if recorder:
                log.write(
                    f"[flightdeck] NCCL Flight Recorder dumps in the run directory: {', '.join(recorder)}\n"
                )
    except OSError:
        pass
    return report
