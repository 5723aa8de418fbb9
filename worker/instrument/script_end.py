"""Each rank says when the script's main code has returned: a later hang is teardown, not a stall.

It also says while it is inside `torch.distributed.destroy_process_group()` (of the default group):
a rank that is leaving its process group has finished training, and torch's own call can hang there
when the ranks leave apart (pytorch/pytorch#75097), so the script never returns to write its end.

A destroyed group is also kept alive until the interpreter's exit. Its last reference is often a
DDP model's Reducer, dropped when the script's main function returns: torch's ProcessGroupGloo
destructor then joins its worker threads while holding the GIL, and a worker still releasing the last
collective's tensors waits for the GIL: both wait for ever, inside the script, where no end marker can
be written (seen with TRL's sft.py, which calls trainer.end(), and a loop that destroys its group).
Kept here, the group goes at the interpreter's teardown, after the marker, when its threads are idle.

The marker is written from threading's exit callbacks, which run when the main module has finished and
before Python joins non-daemon threads and tears down (where gloo, NCCL and loader workers hang). A
script that raised or called sys.exit with a failure writes no marker.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from flightdeck.run_variables import RUN_DIR_VARIABLE
from flightdeck.worker.instrument import END_MARKER_PREFIX, LEAVING_MARKER_PREFIX

_failed: list[bool] = []
# Process groups destroyed by the script, released only with this module at the interpreter's exit.
KEPT_GROUPS: list[Any] = []


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
    path = _marker(END_MARKER_PREFIX)
    if _failed or path is None:
        return  # a failure, or a DataLoader worker's end: not the script's
    _write_end(path, int(os.environ.get("RANK", "0")))


def mark_rank_end(run_dir: Path, rank: int, exit_code: int) -> None:
    """The recipe trainer's rank is done (its result written) and will exit with `exit_code`: what is left
    is teardown."""
    _write_end(run_dir / f"{END_MARKER_PREFIX}{rank}.json", rank, exit_code)


def _write_end(path: Path, rank: int, exit_code: int = 0) -> None:
    with contextlib.suppress(OSError, ValueError):
        path.write_text(
            json.dumps({"rank": rank, "pid": os.getpid(), "time": time.time(), "exit_code": exit_code})
        )


def _marker(prefix: str) -> Path | None:
    run_dir = os.environ.get(RUN_DIR_VARIABLE)
    if not run_dir or multiprocessing.parent_process() is not None:
        return None  # not under Flightdeck, or a DataLoader worker: not a rank
    return Path(run_dir) / f"{prefix}{os.environ.get('RANK', '0')}.json"


def watch_leaving(distributed: ModuleType) -> None:
    """Wrap `torch.distributed.destroy_process_group` (where scripts call it from, and its home module)."""
    wrapped = leaving_marked(distributed.destroy_process_group)
    distributed.destroy_process_group = wrapped
    home = getattr(distributed, "distributed_c10d", None)
    if home is not None:
        home.destroy_process_group = wrapped


def leaving_marked(destroy: Callable[..., Any]) -> Callable[..., Any]:
    """`destroy` with this rank's leaving marker present for as long as it runs (default group only:
    destroying a subgroup is not leaving)."""
    if getattr(destroy, "flightdeck_leaving", False):
        return destroy

    @functools.wraps(destroy)
    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        path = _marker(LEAVING_MARKER_PREFIX) if group is None else None
        KEPT_GROUPS.extend(_groups_destroyed_by(group))
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                path.write_text(json.dumps({"pid": os.getpid(), "time": time.time()}))
        try:
            return destroy(group, *args, **kwargs)
        finally:
            # Returned: the script goes on (it may save after leaving), and its end is its own marker.
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()

    destroy_process_group.flightdeck_leaving = True  # type: ignore[attr-defined]
    return destroy_process_group


def _groups_destroyed_by(group: Any) -> list[Any]:
    """The group, or for the default group every group torch knows (destroying it destroys them all)."""
    if group is not None:
        return [group]
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    try:
        return list(getattr(world, "pg_map", {}))
    except Exception:  # a torch whose bookkeeping differs: nothing kept, nothing broken
        return []
