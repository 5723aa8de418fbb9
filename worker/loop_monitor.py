"""LoopMonitor: Flightdeck's step records and health stops for a plain PyTorch loop that asks for them.

Imported from flightdeck.callback (docs/own-script.md). Nothing here imports transformers: a plain
loop's script need not have it (worker/script_run.py says what importing it would cost).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from flightdeck.recipe.schema import HealthSpec
from flightdeck.worker.script_run import (
    RunFiles,
    collective_device,
    end_process_group_cleanly,
    health_limits,
    rank,
    world_size,
)
from flightdeck.worker.train import grad_norms
from flightdeck.worker.train.health import HealthEvent, HealthMonitor, HealthStop, agreed_fatal


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
        self.files = RunFiles(metrics_path, run_dir)
        self.files.open(rank())
        end_process_group_cleanly()
        self.world_size = world_size()
        self.print_every = max(1, print_every)
        self.global_step = 0
        self.device = collective_device()
        # Norms are taken in after_backward, before any clipping: nothing to undo.
        self.monitor = HealthMonitor(
            health_limits(health, self.files.run_dir),
            planned_steps_per_epoch=None,
            emit=self.files.emit,
            device=self.device,
        )
        self._losses: list[torch.Tensor] = []
        self._trainable: list[torch.nn.Parameter] = []
        self._spread = False  # the trainable tensors are on several devices (a device-mapped model)
        self._grad_norm: torch.Tensor | None = None
        self._last_time = time.perf_counter()
        self._start()

    def _start(self) -> None:
        named = self.monitor.take_inventory(self.model)
        self._trainable = [p for _, p in named if p.requires_grad]
        self._spread = len({p.device for p in self._trainable}) > 1
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
        self._grad_norm = grad_norms.total_norm(grads, spread=self._spread) if grads else None
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
