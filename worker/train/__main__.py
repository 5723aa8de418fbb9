"""Entry point torchrun runs on every rank: `python -m flightdeck.worker.train <run>/recipe.json`."""

from __future__ import annotations

import sys
from pathlib import Path

from flightdeck.worker.log_noise import silence_known_noise
from flightdeck.worker.process_exit import exit_without_teardown
from flightdeck.worker.train.bitsandbytes_gate import keep_bitsandbytes_out_unless_used

silence_known_noise()  # before the trainer's imports bring in transformers, peft and bitsandbytes

if __name__ == "__main__":
    recipe_path = Path(sys.argv[1])
    # Before the trainer's imports: peft imports bitsandbytes (about 1.5 s of a rank's start) whenever it
    # is installed, though most recipes never call it.
    keep_bitsandbytes_out_unless_used(recipe_path)
    from flightdeck.worker.train.exit_status import run_to_exit_code

    # Everything is written and the process group destroyed: no interpreter teardown, where a C++
    # thread left by the process group can abort a finished rank and torchrun would fail the run.
    exit_without_teardown(run_to_exit_code(recipe_path))
