"""Starts torchrun in its own session with output to a file, guards it, and stops its whole tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from flightdeck.worker.agent.terminate import terminate

WATCHDOG_GRACE_SECONDS = 3.0
# torchrun sets it for each rank it starts (and the rank's children inherit it).
RANK_MARK = "LOCAL_RANK"
# The watchdog notices a finished command within one poll (0.25 s) and then exits.
WATCHDOG_REAP_SECONDS = 2.0


class AttemptProcess:
    """A launched command: its own session (pgid == pid) plus a watchdog tied to the agent's life."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path):
        with open(log_path, "ab") as log:
            # A list argv and no shell: nothing from a recipe is ever parsed by a shell.
            self.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                # torchrun (and the ranks until the trainer installs its own handler) ignore SIGUSR1:
                # a scheduler that signals every process of a job (Slurm's --signal=USR1@N without B:) asks the
                # trainer for a checkpoint, and must not end torchrun by the signal's default action.
                preexec_fn=_ignore_checkpoint_signal,
            )
        self.pgid = self.popen.pid
        self._known: dict[int, psutil.Process] = {}
        self.watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flightdeck.worker.agent.watchdog",
                str(os.getpid()),
                str(self.pgid),
                str(WATCHDOG_GRACE_SECONDS),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        self._remember_tree()
        code = self.popen.poll()
        if code is not None:
            self._reap_watchdog()
        return code

    def living(self) -> list[psutil.Process]:
        """Every process of the attempt still alive: the session's group and any known descendant."""
        self._remember_tree()
        alive = []
        for proc in list(self._known.values()):
            if _alive(proc):
                alive.append(proc)
            else:
                self._known.pop(proc.pid, None)
        return alive

    def request_checkpoint(self) -> list[int]:
        """SIGUSR1 to each trainer rank (flightdeck.worker.train): save a checkpoint at the next step, then stop
        (worker/train/checkpoint_stop.py). The pids signalled. torchrun's own command line names the
        trainer too, and a rank's DataLoader workers hold no handler once they exec and would die of it:
        only rank processes (rank_processes) are signalled."""
        sent = []
        for proc in rank_processes(self.living()):
            try:
                if "flightdeck.worker.train" not in proc.cmdline():
                    continue
                proc.send_signal(signal.SIGUSR1)
            except psutil.Error:
                continue
            sent.append(proc.pid)
        return sent

    def stop(self, grace: float, kill_timeout: float = 10.0) -> list[psutil.Process]:
        """SIGTERM the group and every known descendant (a rank that left the session is still ours),
        wait `grace`, SIGKILL the rest; the processes still alive after that."""
        terminate(self.living(), grace, group=self.pgid, child=self.popen, kill_wait=kill_timeout)
        self.popen.poll()
        self._reap_watchdog()
        return self.living()

    def _remember_tree(self) -> None:
        for proc in group_members(self.pgid):
            self._known.setdefault(proc.pid, proc)
        try:
            root = psutil.Process(self.popen.pid)
            if _alive(root):
                self._known.setdefault(root.pid, root)
                for child in root.children(recursive=True):
                    self._known.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def _reap_watchdog(self) -> None:
        """Wait for the watchdog once the command is gone: it ends within a poll (SIGKILLing any rank
        that outlived torchrun), and unwaited it stays a zombie for the agent's life, one per attempt."""
        if self.watchdog.poll() is not None:
            return
        try:
            self.watchdog.wait(timeout=WATCHDOG_REAP_SECONDS)
        except subprocess.TimeoutExpired:
            if not self.living():
                self.watchdog.kill()
                self.watchdog.wait()


def _ignore_checkpoint_signal() -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def group_members(pgid: int) -> list[psutil.Process]:
    """Living processes whose process group is `pgid`."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and _alive(proc):
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def rank_processes(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes torchrun started as ranks: LOCAL_RANK in the environment (torchrun sets it for each
    rank) and a parent that is not one (a DataLoader worker or other child inherits its rank's environment)."""
    marked = {}
    for proc in processes:
        try:
            if RANK_MARK in proc.environ():
                marked[proc.pid] = proc
        except psutil.Error:
            continue
    ranks = []
    for proc in marked.values():
        try:
            if proc.ppid() not in marked:
                ranks.append(proc)
        except psutil.Error:
            continue
    return ranks
