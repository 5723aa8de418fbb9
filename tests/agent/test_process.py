"""Process supervision with real processes: own session, stop leaves nothing, agent death kills the group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flightdeck.worker.agent.process import AttemptProcess, group_members

# A parent that starts a child in its own process group, like torchrun and its ranks.
TREE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def _wait_for(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _start(tmp_path: Path, script: str) -> AttemptProcess:
    log = tmp_path / "output.log"
    proc = AttemptProcess([sys.executable, "-c", script], dict(os.environ), str(tmp_path), log)
    assert _wait_for(lambda: "ready" in log.read_text() and len(proc.living()) == 2, 20)
    return proc


def test_runs_in_its_own_session_with_output_in_the_log(tmp_path: Path) -> None:
    proc = _start(tmp_path, TREE)
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        assert {p.pid for p in group_members(proc.pgid)} == {p.pid for p in proc.living()}
    finally:
        proc.stop(grace=2)


def test_stop_terminates_the_whole_tree(tmp_path: Path) -> None:
    proc = _start(tmp_path, TREE)
    started = time.monotonic()
    assert proc.stop(grace=5) == []
    assert time.monotonic() - started < 5  # SIGTERM was enough
    assert group_members(proc.pgid) == []
    assert proc.popen.returncode == -signal.SIGTERM


def test_stop_kills_what_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    proc = _start(tmp_path, STUBBORN)
    started = time.monotonic()
    assert proc.stop(grace=1) == []
    assert 1 <= time.monotonic() - started < 8
    assert group_members(proc.pgid) == []


def test_agent_killed_with_sigkill_takes_its_processes_along(tmp_path: Path) -> None:
    fake_agent = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from flightdeck.worker.agent.process import AttemptProcess\n"
        f"log = Path({str(tmp_path)!r}) / 'out.log'\n"
        f"proc = AttemptProcess([sys.executable, '-c', {TREE!r}], dict(os.environ), '.', log)\n"
        "print(proc.pgid, flush=True)\n"
        "time.sleep(600)\n"
    )
    agent = subprocess.Popen([sys.executable, "-c", fake_agent], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        pgid = int(agent.stdout.readline())
        assert _wait_for(lambda: len(group_members(pgid)) == 2, 20)
        agent.kill()
        agent.wait()
        assert _wait_for(lambda: not group_members(pgid), 10), "the attempt outlived its agent"
    finally:
        agent.kill()
        for proc in group_members(pgid):
            proc.kill()


def test_the_watchdog_is_reaped_when_a_descendant_outlives_the_command(tmp_path: Path) -> None:
    # Like a rank's DataLoader worker still exiting when torchrun has: the command's child lives on briefly.
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)'], start_new_session=True)\n"
        "time.sleep(1)\n"
    )
    proc = AttemptProcess(
        [sys.executable, "-c", script], dict(os.environ), str(tmp_path), tmp_path / "output.log"
    )
    assert _wait_for(lambda: proc.poll() is not None, 20)
    # Reaped, not a zombie: poll() of a waited Popen returns its code without touching the pid again.
    assert proc.watchdog.returncode is not None
    assert proc.living() == []  # the watchdog SIGKILLed the straggler before it exited


def test_arguments_never_reach_a_shell(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = f'x\'; touch {marker}; echo "$(touch {marker})" `touch {marker}`\n'
    script = "import sys; print(repr(sys.argv[1:]))"
    proc = AttemptProcess([sys.executable, "-c", script, hostile], {}, str(tmp_path), tmp_path / "output.log")
    assert _wait_for(lambda: proc.poll() is not None, 20)
    assert not marker.exists()
    assert repr([hostile]) in (tmp_path / "output.log").read_text()


# torchrun starting one trainer rank, which forks a DataLoader worker (same command line and environment,
# no handler of its own: the default action of SIGUSR1 would end it). torchrun's own command line names
# the trainer's module too, as `torchrun ... -m flightdeck.worker.train` does.
RANK_WITH_LOADER_WORKER = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGUSR1, lambda *_: print('rank got SIGUSR1', flush=True))\n"
    "if os.fork() == 0:\n"
    "    signal.signal(signal.SIGUSR1, signal.SIG_DFL)\n"
    "time.sleep(600)\n"
)
LAUNCHER = (
    "import os, subprocess, sys, time\n"
    "env = {**os.environ, 'RANK': '0', 'LOCAL_RANK': '0'}\n"
    f"subprocess.Popen([sys.executable, '-c', {RANK_WITH_LOADER_WORKER!r}, sys.argv[1]], env=env)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def test_checkpoint_request_reaches_the_trainer_rank_and_not_torchrun_or_the_ranks_loader_worker(
    tmp_path: Path,
) -> None:
    log = tmp_path / "output.log"
    argv = [sys.executable, "-c", LAUNCHER, "flightdeck.worker.train"]
    proc = AttemptProcess(argv, dict(os.environ), str(tmp_path), log)
    try:
        assert _wait_for(lambda: len(proc.living()) == 3, 20)
        launcher, rank, worker = sorted(proc.living(), key=lambda p: p.pid)
        assert rank.ppid() == launcher.pid and worker.ppid() == rank.pid
        assert all("flightdeck.worker.train" in p.cmdline() for p in (launcher, rank, worker))
        assert proc.request_checkpoint() == [rank.pid]
        assert _wait_for(lambda: "rank got SIGUSR1" in log.read_text(), 10)
        time.sleep(0.3)
        assert worker.is_running() and worker.status() != "zombie"
    finally:
        proc.stop(grace=2)
