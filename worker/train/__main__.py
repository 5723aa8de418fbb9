"""Entry point torchrun runs on every rank: `python -m flightdeck.worker.train <run>/recipe.json`."""

from __future__ import annotations

import sys
from pathlib import Path

from flightdeck.worker.log_noise import silence_known_noise
from flightdeck.worker.process_exit import exit_without_teardown

silence_known_noise()  # before the trainer's imports bring in transformers, peft and bitsandbytes

from flightdeck.worker.train.exit_status import run_to_exit_code  # noqa: E402

if __name__ == "__main__":
    # Everything is written and the process group destroyed: no interpreter teardown, where a C++
    # thread left by the process group can abort a finished rank and torchrun would fail the run.
    exit_without_teardown(run_to_exit_code(Path(sys.argv[1])))
