"""Per-step reporting: one metrics.jsonl line and one progress line on rank 0 per logged step."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from transformers import TrainerCallback

from flightdeck.worker.train.health import HealthMonitor
from flightdeck.worker.train.metered_trainer import MeteredTrainer
from flightdeck.worker.train.metrics_file import MetricsFile


def _memory_mb() -> tuple[float, float]:
    """Allocated and peak memory of the current GPU: one read of the allocator's statistics (each of
    memory_allocated() and max_memory_allocated() builds the whole statistics dict again)."""
    stats = torch.cuda.memory_stats()
    allocated, peak = stats.get("allocated_bytes.all.current", 0), stats.get("allocated_bytes.all.peak", 0)
    return allocated / 2**20, peak / 2**20


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


class StepReporter(TrainerCallback):
    """Writes the step record (loss, lr, grad norms, throughput, memory) and prints progress."""

    def __init__(
        self,
        monitor: HealthMonitor,
        metrics: MetricsFile | None,
        *,
        stage: int,
        stages: int,
        step_offset: int = 0,
        world_size: int = 1,
    ):
        self.monitor = monitor
        self.metrics = metrics
        self.stage, self.stages = stage, stages
        self.step_offset = step_offset
        self.world_size = world_size
        self.trainer: MeteredTrainer | None = None
        self._last_time = time.perf_counter()
        self._last_step = 0
        self.evaluates = False  # set when the stage has data.eval
        # The trainer's own runs measure the final model once more; a user's script decides for itself.
        self.final_eval = True
        self._pending: tuple[int, dict[str, Any]] | None = None
        self._on_gpu = torch.cuda.is_available()  # asked once: it does not change during a run

    def on_train_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        self._last_time, self._last_step = time.perf_counter(), state.global_step

    def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        if self.evaluates and self.final_eval and state.global_step >= state.max_steps:
            control.should_evaluate = True  # the final model is always measured once

    def on_evaluate(self, args, state, control, metrics=None, **kw):  # type: ignore[no-untyped-def]
        """data.eval's loss joins this step's record (key eval_loss): one record per step, so a reader
        whose cursor has passed the step never misses it."""
        if not state.is_world_process_zero or not metrics or "eval_loss" not in metrics:
            return
        step, record = self._pending or (self.step_offset + state.global_step, {"stage": self.stage})
        self._pending = None
        record["eval_loss"] = metrics["eval_loss"]
        if self.metrics is not None:
            self.metrics.step(step, record)
        print(
            f"[flightdeck] stage {self.stage + 1}/{self.stages} step {state.global_step}/{state.max_steps} "
            f"eval_loss {_fmt(metrics['eval_loss'])} eval_runtime {metrics.get('eval_runtime', 0):.2f}s",
            flush=True,
        )

    def on_log(self, args, state, control, logs=None, **kw):  # type: ignore[no-untyped-def]
        if not logs or "loss" not in logs:
            return
        now = time.perf_counter()
        steps = max(state.global_step - self._last_step, 1)
        elapsed = now - self._last_time
        self._last_time, self._last_step = now, state.global_step
        tokens: int | None
        if self.trainer is not None:
            tokens, samples = self.trainer.take_meter()
        else:
            # Any HF Trainer (a user's script): rows from the batch settings, tokens unknown.
            tokens, samples = (
                None,
                steps * args.per_device_train_batch_size * args.gradient_accumulation_steps,
            )
        if not state.is_world_process_zero:
            return
        grad_norm = logs.get("grad_norm")
        allocated, peak = _memory_mb() if self._on_gpu else (0.0, 0.0)
        # Ranks see equal-sized batches, so rank 0's count times the world size is the global rate.
        record: dict[str, Any] = {
            "epoch": state.epoch,
            "loss": logs.get("loss"),
            "learning_rate": logs.get("learning_rate"),
            "grad_norm": grad_norm,
            "adapter_grad_norm": self.monitor.adapter_grad_norm(grad_norm)
            if self.monitor.has_adapter
            else None,
            "trainable_params": self.monitor.trainable_params,
            "tokens_per_second": tokens * self.world_size / elapsed
            if elapsed > 0 and tokens is not None
            else None,
            "samples_per_second": samples * self.world_size / elapsed if elapsed > 0 else None,
            "step_time": elapsed / steps,
            "gpu_memory_allocated_mb": allocated,
            "gpu_memory_peak_mb": peak,
            "stage": self.stage,
        }
        step = self.step_offset + state.global_step
        if control.should_evaluate and self.evaluates:
            self._pending = (step, record)  # written with the eval loss that follows in this step
        elif self.metrics is not None:
            self.metrics.step(step, record)
        loss = record["loss"]
        print(
            f"[flightdeck] stage {self.stage + 1}/{self.stages} step {state.global_step}/{state.max_steps} "
            f"loss {_fmt(loss) if loss is None or math.isfinite(loss) else loss} grad_norm {_fmt(grad_norm)} "
            f"adapter_grad_norm {_fmt(record['adapter_grad_norm'])} lr {_fmt(record['learning_rate'])} "
            f"step_time {record['step_time']:.3f}s",
            flush=True,
        )
