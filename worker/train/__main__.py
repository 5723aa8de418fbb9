"""Entry point torchrun runs on every rank: `python -m worker.train <run>/recipe.json`."""

from __future__ import annotations

import sys
from pathlib import Path

from worker.train.outcome import run_to_exit_code

if __name__ == "__main__":
    sys.exit(run_to_exit_code(Path(sys.argv[1])))
