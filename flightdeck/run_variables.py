"""The variables the launch plan sets for a job's ranks and the ranks read: their names, and nothing
imported, so what reads them at a rank's start (an instrumented script's hooks, the recipe trainer's
bitsandbytes gate) pays nothing for them. The plan gives each its value and reason
(flightdeck/launch/environment.py)."""

# Relative recipe paths resolve against it.
WORKSPACE_VARIABLE = "FLIGHTDECK_WORKSPACE"
# Rank 0 writes metrics.jsonl and result.json here; the ranks' markers go here too.
RUN_DIR_VARIABLE = "FLIGHTDECK_RUN_DIR"
# "1": the ranks (not torchrun) install the instrumentation hooks (worker/instrument/).
INSTRUMENT_VARIABLE = "FLIGHTDECK_INSTRUMENT"
# A retried attempt's checkpoint to resume from ("" for none), resolved by the runner on its host.
RESUME_VARIABLE = "FLIGHTDECK_RESUME_FROM"
