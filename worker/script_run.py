"""A user's script's run under Flightdeck, as the callback and the loop monitors see it from inside a rank.

Which rank this is and how many there are, where agreement collectives run, the health limits of the
job's recipe, rank 0's files (metrics.jsonl, result.json) and how the process ends after a health stop.
Shared by FlightdeckCallback (a Trainer script), LoopMonitor (a plain loop that asks for it) and the
loop watch (a plain loop instrumented with no edit). It imports torch and nothing of transformers: a
plain loop's ranks load it at their first step, and transformers' trainer module brings peft and
bitsandbytes with it (about 7 s on this project's 2-core machine, bench/README.md "First step").
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from flightdeck.contracts import METRICS_FILE, RECIPE_FILE
from flightdeck.recipe.schema import HealthSpec
from flightdeck.run_variables import RUN_DIR_VARIABLE
from flightdeck.worker.train.health import HealthEvent, HealthStop, report_event
from flightdeck.worker.train.metrics_file import MetricsFile
from flightdeck.worker.train.result import HEALTH_EXIT_CODE, write_result


def rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def collective_device() -> torch.device:
    """Where agreement tensors live: NCCL reduces only CUDA tensors, gloo CPU ones."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def health_limits(given: HealthSpec | Mapping[str, Any] | None, run_dir: Path | None) -> HealthSpec:
    """The limits given, else the job's recipe's `health` (under Flightdeck), else the defaults."""
    if isinstance(given, HealthSpec):
        return given
    if given is not None:
        return HealthSpec.model_validate(dict(given))
    recipe = run_dir / RECIPE_FILE if run_dir is not None else None
    if recipe is not None and recipe.is_file():
        return HealthSpec.model_validate(json.loads(recipe.read_text(encoding="utf-8")).get("health") or {})
    return HealthSpec()


class RunFiles:
    """Rank 0's records: metrics.jsonl (run directory or the user's path), result.json, the log."""

    def __init__(self, metrics_path: str | Path | None, run_dir: str | Path | None):
        found = run_dir if run_dir is not None else os.environ.get(RUN_DIR_VARIABLE)
        self.run_dir = Path(found) if found else None
        if metrics_path is not None:
            self.metrics_path: Path | None = Path(metrics_path)
        else:
            self.metrics_path = self.run_dir / METRICS_FILE if self.run_dir is not None else None
        self.metrics: MetricsFile | None = None
        self.is_main = True

    def open(self, rank: int) -> None:
        self.is_main = rank == 0
        if self.is_main and self.metrics is None and self.metrics_path is not None:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            self.metrics = MetricsFile(self.metrics_path)

    def emit(self, event: HealthEvent) -> None:
        if self.is_main:
            report_event(self.metrics, event)

    def stopped(self, event: HealthEvent) -> None:
        """A fatal finding: result.json as the trainer writes it, and exit 42 if nothing catches the stop."""
        if self.is_main and self.run_dir is not None:
            write_result(
                self.run_dir, status="failed", failure_code=event.code, message=event.message, fix=event.fix
            )
        exit_on_uncaught_stop()

    def finished(self, output_dir: str | None) -> None:
        if self.is_main and self.run_dir is not None:
            output = str(Path(output_dir).resolve()) if output_dir else None
            write_result(self.run_dir, status="succeeded", message="training finished", output_path=output)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None


def exit_on_uncaught_stop() -> None:
    """Make an uncaught HealthStop end the process with the health exit code (42), as recipe jobs do.

    Only the stop is turned into 42; any other uncaught exception keeps Python's own handling.
    """
    previous = sys.excepthook
    if getattr(previous, "flightdeck", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(value, HealthStop):
            previous(kind, value, tb)
            return
        event = value.event
        print(f"[flightdeck] stopped: {event.code}: {event.message}", file=sys.stderr, flush=True)
        if event.fix:
            print(f"[flightdeck] fix: {event.fix}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Skip interpreter teardown: a process group's threads can abort it (SIGABRT), and every rank
        # stops at the same step, so no peer waits in a collective for this one.
        os._exit(HEALTH_EXIT_CODE)

    hook.flightdeck = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _destroy_process_group_at_exit() -> None:
    """End the process group at exit, while the interpreter is still whole, unless the script did.

    A script that exits with its process group alive (every HF Trainer script: the Trainer never
    destroys it) can die of SIGABRT during interpreter teardown: gloo's threads still hold work objects
    whose tensors need the GIL as Python is being finalised (pytorch/pytorch#179291). The run trained
    to the end, then torchrun reports a failed rank. atexit handlers run before that teardown.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def end_process_group_cleanly() -> None:
    """Register the exit hook, once however many callbacks or monitors a script builds."""
    atexit.unregister(_destroy_process_group_at_exit)  # removes an earlier registration, if any
    atexit.register(_destroy_process_group_at_exit)
