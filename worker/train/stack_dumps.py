"""Each trainer rank dumps its own Python stack to <run>/stacks/rank-<RANK>.txt (H006).

SIGUSR1: on the agent's request, when py-spy cannot read the rank (with checkpoints on, it also asks for
a checkpoint and a stop: the dump chains to that handler, worker/train/checkpoint_stop.py). SIGTERM (then the default action):
when torchrun tears the surviving ranks down after one died (H005), or the agent stops the attempt,
the place each rank was in is left on disk for the agent to report.
"""

from __future__ import annotations

import faulthandler
import signal
from pathlib import Path
from typing import IO

from flightdeck.contracts import STACKS_DIR

_open: list[IO[str]] = []  # faulthandler writes to the file descriptor: keep the file open


def dump_stacks_on_signals(run_dir: Path, rank: int, *, chain_usr1: bool = False) -> Path:
    """Register the handlers; the file's existence tells the agent SIGUSR1 is safe to send.
    `chain_usr1`: a Python SIGUSR1 handler is installed; it runs after the dump."""
    path = run_dir / STACKS_DIR / f"rank-{rank}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held for the process's life
    _open.append(handle)
    faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True, chain=chain_usr1)
    faulthandler.register(signal.SIGTERM, file=handle, all_threads=True, chain=True)
    return path
