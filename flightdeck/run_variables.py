"""The variables the launch plan sets for a job's ranks and the ranks read: their names, and nothing
imported but the standard library, so what reads them at a rank's start (an instrumented script's hooks,
the recipe trainer's bitsandbytes gate) pays nothing for them. The plan gives each its value and reason
(flightdeck/launch/environment.py)."""

import os
from pathlib import Path

# Relative recipe paths resolve against it.
WORKSPACE_VARIABLE = "FLIGHTDECK_WORKSPACE"
# Rank 0 writes metrics.jsonl and result.json here; the ranks' markers go here too.
RUN_DIR_VARIABLE = "FLIGHTDECK_RUN_DIR"
# "1": the ranks (not torchrun) install the instrumentation hooks (worker/instrument/).
INSTRUMENT_VARIABLE = "FLIGHTDECK_INSTRUMENT"
# A retried attempt's checkpoint to resume from ("" for none), resolved by the runner on its host.
RESUME_VARIABLE = "FLIGHTDECK_RESUME_FROM"


def run_workspace() -> Path:
    """The directory a rank resolves a recipe's relative paths against: the job's workspace (the
    process's own directory where no plan set it: a rank started by hand)."""
    return Path(os.environ.get(WORKSPACE_VARIABLE) or os.getcwd())
