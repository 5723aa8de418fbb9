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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from flightdeck.recipe.schema import HealthSpec
from flightdeck.worker.loop_monitor import LoopMonitor
from flightdeck.worker.script_run import RunFiles, end_process_group_cleanly, health_limits, rank
from flightdeck.worker.train.adapter_save_check import AdapterSaveCheck
from flightdeck.worker.train.eos_supervision import masked_eos_event
from flightdeck.worker.train.health import HealthEvent, HealthMonitor, HealthStop
from flightdeck.worker.train.loss_kwargs import accumulation_event
from flightdeck.worker.train.spawned_dataset import spawned_dataset_event
from flightdeck.worker.train.step_report import StepReporter

__all__ = ["FlightdeckCallback", "HealthStop", "LoopMonitor"]


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
        self.files = RunFiles(metrics_path, run_dir)
        self.health = health_limits(health, self.files.run_dir)
        end_process_group_cleanly()
        self.monitor: HealthMonitor | None = None
        self.reporter: StepReporter | None = None

    def _parts(self, args: Any) -> tuple[HealthMonitor, StepReporter]:
        if self.monitor is None or self.reporter is None:
            # The launcher's rank, not the Trainer's process_index: a Trainer that did not join the ranks'
            # process group (accelerate saw no GPU and no use_cpu) counts itself process 0 on every rank.
            self.files.open(rank())
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


def _stop_on(event: HealthEvent | None) -> None:
    if event is not None:
        raise HealthStop(event)
