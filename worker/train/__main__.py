"""Entry point torchrun runs on every rank: `python -m flightdeck.worker.train <run>/recipe.json`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flightdeck.worker.log_noise import silence_known_noise

silence_known_noise()  # before the trainer's imports bring in transformers, peft and bitsandbytes

from flightdeck.worker.train.exit_status import run_to_exit_code  # noqa: E402

if __name__ == "__main__":
    code = run_to_exit_code(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and the process group destroyed: skip interpreter teardown, where a C++
    # thread left by the process group can abort a finished rank ("terminate called without an active
    # exception", SIGABRT), and torchrun would fail a run that succeeded.
    os._exit(code)
