"""SIGUSR1 while checkpoints are on: save a checkpoint at the next step boundary, then stop (G017).

Slurm sends it ahead of a time limit or a preemption (`sbatch --signal=B:USR1@<seconds>`, forwarded to the ranks); the attempt
runner sends it to the ranks before it stops an attempt (a cancel, a lost lease, the agent stopping),
then waits its grace. Every rank must stop at the same step (the save and the next step are
collectives), so at each step's end the ranks agree on whether any of them was signalled.

SIGTERM keeps its meaning (worker/train/stack_dumps.py): torchrun sends it to the surviving ranks when
one died, and those are inside a collective that never completes, so there is no step boundary to save
at; whoever wants a checkpoint before a SIGTERM sends SIGUSR1 first and gives the save its grace.
"""

from __future__ import annotations

import signal
from typing import Any

from transformers import TrainerCallback

from flightdeck.worker.train.health import any_rank

STOP_SIGNAL = signal.SIGUSR1


class CheckpointStop(Exception):
    """Training stopped on a signal after saving a checkpoint at `step` (the run's step count)."""

    def __init__(self, signal_name: str, step: int):
        super().__init__(f"{signal_name}: stopped after saving the checkpoint of step {step}")
        self.signal_name = signal_name
        self.step = step


class CheckpointOnSignal(TrainerCallback):
    """Install once per process (`install`), add to each stage's Trainer; `stopped` says it stopped one."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self.stopped_at: int | None = None

    def install(self) -> None:
        """Before faulthandler's SIGUSR1 stack dump registers (it chains to this handler)."""
        signal.signal(STOP_SIGNAL, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Only a flag: the save happens at the next step boundary, on every rank together.
        self.requested = signal.Signals(signum).name
        print(
            f"[flightdeck] {self.requested}: saving a checkpoint at the next step, then stopping", flush=True
        )

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.stopped_at is not None:
            return control
        if not any_rank(self.requested is not None, args.device):
            return control
        self.requested = self.requested or STOP_SIGNAL.name  # another rank was signalled
        if state.max_steps and state.global_step >= state.max_steps:
            return control  # the last step: training ends here anyway, with its output
        control.should_save = True
        control.should_training_stop = True
        self.stopped_at = state.global_step
        return control
