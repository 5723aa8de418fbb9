"""An agent SIGKILLed while a rank ignores SIGTERM: the watchdog must not leave that rank running.

torchrun starts every rank in a session of its own, so killing torchrun's process group does not
reach the ranks. Here a stand-in launcher does what torchrun does (start a child with
start_new_session, forward SIGTERM to it, wait for it) and the child ignores SIGTERM, as a rank
blocked in a collective does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.agent.processes import wait_until

ROOT = Path(__file__).resolve().parents[2]

_RANK = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
_LAUNCHER = textwrap.dedent(
    f"""
    import signal, subprocess, sys, time
    rank = subprocess.Popen([sys.executable, "-c", {_RANK!r}], start_new_session=True)
    print(rank.pid, flush=True)
    def forward(signum, frame):
        rank.send_signal(signum)
        time.sleep(30)  # torchrun waits for its ranks before it escalates
    signal.signal(signal.SIGTERM, forward)
    rank.wait()
    """
)
_AGENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from flightdeck.worker.agent.process import AttemptProcess
    launched = AttemptProcess([sys.executable, "-c", sys.argv[1]], {}, ".", Path(sys.argv[2]))
    print(launched.pid, flush=True)
    time.sleep(120)
    """
)

# Several real service processes and agents: the slow run (CI) covers it; the default run stays in its 6 minutes.
pytestmark = pytest.mark.slow


def _rank_pid(log: Path) -> int | None:
    text = log.read_text() if log.exists() else ""
    return int(text.split()[0]) if text.strip() else None


def test_a_rank_ignoring_sigterm_dies_with_its_killed_agent(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agent = subprocess.Popen(
        [sys.executable, "-c", _AGENT, _LAUNCHER, str(log)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    rank: psutil.Process | None = None
    try:
        rank_pid = wait_until(lambda: _rank_pid(log), 30, "the stand-in rank to start")
        rank = psutil.Process(rank_pid)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        killed_at = time.monotonic()
        deadline = killed_at + 10  # the watchdog's grace is 3 s
        while time.monotonic() < deadline and rank.is_running() and rank.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        assert not (rank.is_running() and rank.status() != psutil.STATUS_ZOMBIE), "the rank was orphaned"
    finally:
        if agent.poll() is None:
            agent.kill()
        if rank is not None and rank.is_running():
            rank.kill()
