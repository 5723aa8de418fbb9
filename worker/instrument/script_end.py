"""Each rank says when the script's main code has returned: a later hang is teardown, not a stall.

The marker is written from threading's exit callbacks, which run when the main module has finished and
before Python joins non-daemon threads and tears down (where gloo, NCCL and loader workers hang). A
script that raised or called sys.exit with a failure writes no marker.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from flightdeck.worker.instrument import END_MARKER_PREFIX

_failed: list[bool] = []


def install() -> None:
    previous_hook = sys.excepthook
    original_exit = sys.exit

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        _failed.append(True)
        previous_hook(kind, value, tb)

    def exit(code: Any = None) -> None:
        if code not in (None, 0):
            _failed.append(True)
        original_exit(code)

    sys.excepthook = hook
    sys.exit = exit
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(mark_end)


def mark_end() -> None:
    run_dir = os.environ.get("FLIGHTDECK_RUN_DIR")
    if _failed or not run_dir or multiprocessing.parent_process() is not None:
        return  # a failure, or a DataLoader worker's end: not the script's
    rank = os.environ.get("RANK", "0")
    path = Path(run_dir) / f"{END_MARKER_PREFIX}{rank}.json"
    with contextlib.suppress(OSError, ValueError):
        path.write_text(json.dumps({"rank": int(rank), "pid": os.getpid(), "time": time.time()}))
