"""Instrumentation of a user's script with no edit to it (script jobs, `entrypoint.instrument`).

The launch plan puts `autoload/` on the ranks' PYTHONPATH: Python imports its `sitecustomize` at
start-up, which installs post-import hooks (hooks.py). Once the script imports transformers, every
`Trainer` gets FlightdeckCallback (trainer_patch.py); once it imports torch, torch's global optimizer
step hooks watch a plain loop (loop_watch.py); when the main script returns, the rank says so
(script_end.py), as it does while it leaves its process group, so that a hang in teardown is not taken
for a stall. This module imports nothing
heavy: the agent reads AUTOLOAD_DIR from it.
"""

from __future__ import annotations

from pathlib import Path

AUTOLOAD_DIR = Path(__file__).resolve().parent / "autoload"
# <run dir>/script-end-rank<N>.json: rank N's main script returned, or the recipe trainer's rank N is done
# with `exit_code` (script_end.py; the agent reads it).
END_MARKER_PREFIX = "script-end-rank"
# <run dir>/leaving-rank<N>.json: rank N is inside destroy_process_group() of its default group, so done
# training (script_end.py writes it on entry and removes it if the call returns). torch's own
# destroy_process_group can hang when the ranks leave apart (pytorch/pytorch#75097), with no return.
LEAVING_MARKER_PREFIX = "leaving-rank"
