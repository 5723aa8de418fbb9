"""Runs the agent's host check from several threads at once in a fresh interpreter; prints the errors.

`python -m tests.reliability.host_check_race WORKSPACE THREADS`, as an agent with free slots does
when it claims several attempts at once right after it starts.
"""

from __future__ import annotations

import json
import sys
import threading

from flightdeck.inventory import WorkerInventory
from flightdeck.worker.agent.host_check import run_host_check
from flightdeck.worker.process_exit import exit_without_teardown
from tests.agent.processes import tiny_recipe


def main(workspace: str, threads: int) -> list[str]:
    inventory = WorkerInventory.model_validate(
        {"hostname": "race", "cpu_slots": threads, "cores": 2, "workspace": workspace, "runs_dir": workspace}
    )
    recipe = tiny_recipe(max_steps=2)
    recipe["resources"]["gpus_per_node"] = 1
    errors: list[str] = []

    def check(device: int) -> None:
        try:
            errors.extend(f["message"] for f in run_host_check(recipe, inventory, [device]).errors)
        except Exception as exc:  # reported to the test like a finding
            errors.append(repr(exc))

    running = [threading.Thread(target=check, args=(i,)) for i in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    return errors


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
    # As the agent's processes end: an abort in the interpreter's teardown (Arrow's parquet threads)
    # after the checks is not what this probe is about.
    exit_without_teardown(0)
