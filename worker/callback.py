"""Flightdeck's per-step metrics and run-time health stops in your own training script.

HF Trainer: one line (keep this import path; scripts depend on it)::

    from flightdeck.callback import FlightdeckCallback
    trainer = Trainer(..., callbacks=[FlightdeckCallback()])

A plain PyTorch loop::

    from flightdeck.callback import LoopMonitor
    monitor = LoopMonitor(model, optimizer)          # G001/G003/P002 checks before step 1
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        monitor.after_backward(loss)                 # before clipping: gradient norms as they are
        optimizer.step()
        monitor.step()                               # one metrics record and the step checks
        optimizer.zero_grad()

Under Flightdeck (the agent sets FLIGHTDECK_RUN_DIR) rank 0 writes metrics.jsonl, the file the
agent ships, and result.json; the health limits come from the job's recipe (`health`). A fatal
finding stops every rank at the same step and the process exits 42 with the code, message and fix in
result.json, exactly as a recipe job. Outside Flightdeck give `metrics_path` to keep the records, or
nothing to only print them. docs/own-script.md describes both.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from flightdeck.contracts import METRICS_FILE, RECIPE_FILE
from flightdeck.recipe.schema import HealthSpec
from flightdeck.worker.train.adapter_save_check import AdapterSaveCheck
from flightdeck.worker.train.eos_supervision import masked_eos_event
from flightdeck.worker.train.health import HealthEvent, HealthMonitor, HealthStop, agreed_fatal, report_event
from flightdeck.worker.train.loss_kwargs import accumulation_event
from flightdeck.worker.train.metrics_file import MetricsFile
from flightdeck.worker.train.result import HEALTH_EXIT_CODE, write_result
from flightdeck.worker.train.spawned_dataset import spawned_dataset_event
from flightdeck.worker.train.step_report import StepReporter

RUN_DIR_VARIABLE = "FLIGHTDECK_RUN_DIR"

__all__ = ["FlightdeckCallback", "HealthStop", "LoopMonitor"]


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def _collective_device() -> torch.device:
    """Where agreement tensors live: NCCL reduces only CUDA tensors, gloo CPU ones."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _health(given: HealthSpec | Mapping[str, Any] | None, run_dir: Path | None) -> HealthSpec:
    """The limits given, else the job's recipe's `health` (under Flightdeck), else the defaults."""
    if isinstance(given, HealthSpec):
        return given
    if given is not None:
        return HealthSpec.model_validate(dict(given))
    recipe = run_dir / RECIPE_FILE if run_dir is not None else None
    if recipe is not None and recipe.is_file():
        return HealthSpec.model_validate(json.loads(recipe.read_text(encoding="utf-8")).get("health") or {})
    return HealthSpec()


class _RunFiles:
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
        _exit_on_uncaught_stop()

    def finished(self, output_dir: str | None) -> None:
        if self.is_main and self.run_dir is not None:
            output = str(Path(output_dir).resolve()) if output_dir else None
            write_result(self.run_dir, status="succeeded", message="training finished", output_path=output)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None


def _exit_on_uncaught_stop() -> None:
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


def _end_process_group_cleanly() -> None:
    """Register the exit hook, once however many callbacks or monitors a script builds."""
    atexit.unregister(_destroy_process_group_at_exit)  # removes an earlier registration, if any
    atexit.register(_destroy_process_group_at_exit)


class FlightdeckCallback(TrainerCallback):
    """HF Trainer callback: the trainer's step records and health stops for any Trainer script.

    `metrics_path`: where metrics.jsonl goes outside Flightdeck (under Flightdeck, the run
    directory). `health`: limits (HealthSpec or a dict of its fields) instead of the recipe's.
    """

    def __init__(
        self,
        metrics_path: str | Path | None = None,
        *,
        health: HealthSpec | Mapping[str, Any] | None = None,
        run_dir: str | Path | None = None,
    ):
        self.files = _RunFiles(metrics_path, run_dir)
        self.health = _health(health, self.files.run_dir)
        _end_process_group_cleanly()
        self.monitor: HealthMonitor | None = None
        self.reporter: StepReporter | None = None

    def _parts(self, args: Any) -> tuple[HealthMonitor, StepReporter]:
        if self.monitor is None or self.reporter is None:
            self.files.open(args.process_index)
            self.monitor = HealthMonitor(
                self.health,
                planned_steps_per_epoch=None,
                emit=self.files.emit,
                device=args.device,
                max_grad_norm=args.max_grad_norm or None,
            )
            self.reporter = StepReporter(self.monitor, self.files.metrics, stage=0, stages=1)
            self.reporter.world_size = args.world_size
            self.reporter.evaluates = str(args.eval_strategy) not in ("no", "IntervalStrategy.NO")
            self.reporter.final_eval = False
        return self.monitor, self.reporter

    def _guarded(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except HealthStop as stop:
            self.files.stopped(stop.event)
            self.files.close()
            raise

    def on_init_end(self, args, state, control, model=None, **kw):  # type: ignore[no-untyped-def]
        # G001 before DDP wraps the model: DDP itself refuses a model with nothing to train.
        if model is not None:
            monitor, _ = self._parts(args)
            self._guarded(monitor.check_model, model)

    def on_train_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        monitor, reporter = self._parts(args)
        reporter.on_train_begin(args, state, control, **kw)
        self._guarded(monitor.on_train_begin, args, state, control, **kw)
        # D004 (R3): the dataset as the loader's spawned workers will receive it; every rank's own loader.
        self._guarded(_stop_on, spawned_dataset_event(kw.get("train_dataloader")))
        if args.process_index == 0:  # G012: the script's own collator on its first rows; G015
            eos = masked_eos_event(kw.get("processing_class"), kw.get("train_dataloader"))
            # G015: the script's model and accumulation, as the Trainer itself judges them.
            loss_kwargs = accumulation_event(kw.get("model"), args.gradient_accumulation_steps)
            for event in (eos, loss_kwargs):
                if event is not None:
                    self.files.emit(event)

    def on_save(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        # G014: the checkpoint the Trainer just wrote holds every trained adapter tensor.
        self._parts(args)
        self._guarded(AdapterSaveCheck(self.files.emit).on_save, args, state, control, **kw)

    def on_pre_optimizer_step(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        monitor, _ = self._parts(args)
        monitor.on_pre_optimizer_step(args, state, control, **kw)

    # No on_step_end: the reporter's only asks for a final evaluation (final_eval, off here: a user's
    # script decides that itself), and every hook is one more call at every step (bench.monitor_overhead).

    def on_log(self, args, state, control, logs=None, **kw):  # type: ignore[no-untyped-def]
        monitor, reporter = self._parts(args)
        reporter.on_log(args, state, control, logs=logs, **kw)  # the record first, then the judgement
        self._guarded(monitor.on_log, args, state, control, logs=logs, **kw)

    def on_evaluate(self, args, state, control, metrics=None, **kw):  # type: ignore[no-untyped-def]
        _, reporter = self._parts(args)
        reporter.on_evaluate(args, state, control, metrics=metrics, **kw)

    def on_train_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        self.files.finished(args.output_dir)


class LoopMonitor:
    """The same checks and records for a plain PyTorch loop (no HF Trainer).

    Call `after_backward(loss)` after each backward (before clipping) and `step()` once per optimizer
    step, before `zero_grad()`. Under DDP every rank calls both at the same points: a fatal finding is
    agreed across ranks and raised as HealthStop on all of them.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        metrics_path: str | Path | None = None,
        health: HealthSpec | Mapping[str, Any] | None = None,
        run_dir: str | Path | None = None,
        print_every: int = 1,
    ):
        self.model = model
        self.optimizer = optimizer
        self.files = _RunFiles(metrics_path, run_dir)
        self.files.open(_rank())
        _end_process_group_cleanly()
        self.world_size = _world_size()
        self.print_every = max(1, print_every)
        self.global_step = 0
        self.device = _collective_device()
        # Norms are taken in after_backward, before any clipping: nothing to undo.
        self.monitor = HealthMonitor(
            _health(health, self.files.run_dir),
            planned_steps_per_epoch=None,
            emit=self.files.emit,
            device=self.device,
        )
        self._losses: list[torch.Tensor] = []
        self._trainable: list[torch.nn.Parameter] = []
        self._grad_norm: torch.Tensor | None = None
        self._last_time = time.perf_counter()
        self._start()

    def _start(self) -> None:
        named = self.monitor.take_inventory(self.model)
        self._trainable = [p for _, p in named if p.requires_grad]
        wrapped = isinstance(self.model, torch.nn.DataParallel)
        n_gpu = len(self.model.device_ids or []) if wrapped else 1  # type: ignore[arg-type]
        args = _LoopArgs(n_gpu=n_gpu)
        event = self.monitor.start_checks(named, self.optimizer, None, args)
        self._judge(event)
        self.files.emit(
            HealthEvent(
                None,
                "info",
                f"training started: {self.monitor.trainable_params:,} trainable parameters, model wrapped as "
                f"{type(self.model).__name__}",
                step=0,
                data={
                    "trainable_params": self.monitor.trainable_params,
                    "adapter_tensors": self.monitor.adapter_tensors,
                    "wrapper": type(self.model).__name__,
                    "world_size": self.world_size,
                },
            )
        )

    def after_backward(self, loss: torch.Tensor | float) -> None:
        """Record one micro-batch's loss and the gradients as they stand (accumulated so far)."""
        self._losses.append(loss.detach().float() if isinstance(loss, torch.Tensor) else torch.tensor(loss))
        grads = [p.grad for p in self._trainable if p.grad is not None]
        self._grad_norm = (
            torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(grads)]))
            if grads
            else None
        )
        self.monitor.on_pre_optimizer_step(None, None, None)

    def step(self, *, grad_norm: float | None = None, learning_rate: float | None = None) -> None:
        """One optimizer step done: write its record (rank 0) and run the step checks on every rank."""
        self.global_step += 1
        loss = float(torch.stack(self._losses).mean()) if self._losses else None
        self._losses = []
        if grad_norm is None and self._grad_norm is not None:
            grad_norm = float(self._grad_norm)
        if learning_rate is None and self.optimizer is not None:
            learning_rate = float(self.optimizer.param_groups[0]["lr"])
        adapter_norm = self.monitor.adapter_grad_norm(grad_norm)
        now = time.perf_counter()
        step_time, self._last_time = now - self._last_time, now
        record = {
            "loss": loss,
            "learning_rate": learning_rate,
            "grad_norm": grad_norm,
            "adapter_grad_norm": adapter_norm if self.monitor.has_adapter else None,
            "trainable_params": self.monitor.trainable_params,
            "step_time": step_time,
            "stage": 0,
        }
        if self.files.is_main:
            if self.files.metrics is not None:
                self.files.metrics.step(self.global_step, record)
            if self.global_step % self.print_every == 0:
                shown = "-" if loss is None else f"{loss:.4g}" if math.isfinite(loss) else str(loss)
                print(
                    f"[flightdeck] step {self.global_step} loss {shown} grad_norm {_fmt(grad_norm)} "
                    f"adapter_grad_norm {_fmt(record['adapter_grad_norm'])} step_time {step_time:.3f}s",
                    flush=True,
                )
        self._judge(
            self.monitor.step_checks(self.global_step, self.global_step, loss, grad_norm, adapter_norm)
        )

    def finish(self, output_dir: str | Path | None = None) -> None:
        """Training is over: result.json says so under Flightdeck; the metrics file is closed."""
        self.files.finished(str(output_dir) if output_dir is not None else None)
        self.files.close()

    def _judge(self, event: HealthEvent | None) -> None:
        fatal = agreed_fatal(event, self.device)
        if fatal is None:
            return
        self.files.emit(fatal)
        self.files.stopped(fatal)
        self.files.close()
        raise HealthStop(fatal)


class _LoopArgs:
    """What HealthMonitor.start_checks reads from TrainingArguments, for a loop without them."""

    def __init__(self, n_gpu: int):
        self.n_gpu = n_gpu
        self.gradient_accumulation_steps = 1


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _stop_on(event: HealthEvent | None) -> None:
    if event is not None:
        raise HealthStop(event)
