"""Slurm's warning ahead of a time limit or a preemption, on the real two-node cluster: the trainer saves a
checkpoint and stops, and the retry, a second Slurm job, resumes from it.

Slurm delivers the warning (`sbatch --signal=B:USR1@N`) to the batch shell alone; `scancel --batch
--signal=USR1` delivers it exactly that way, at once, instead of waiting for a time limit. The recipe's
DataLoader has two worker processes (spawned: no SIGUSR1 handler of their own), which a signal sent to
every process of the job would end, failing the run instead of saving it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from flightdeck.worker.checkpoints import find_resume_point, incomplete_because

from ..agent.processes import tiny_recipe
from ..agent.test_end_to_end import _steps, _submit, _wait_status, _wait_training
from .cluster import SlurmCluster
from .conftest import slurm_events

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
# Enough steps that the run is still training when the warning lands: a step of the tiny model takes
# 50-300 ms, and the warning goes out once step 1 is shipped (shipping runs every second).
STEPS = 200


def test_slurms_warning_to_the_batch_shell_saves_a_checkpoint_and_a_second_slurm_job_resumes_from_it(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    service, worker = on_slurm()
    api = service.api()
    # One rank (the ranks' agreement to stop together is tested in tests/trainer/test_resume.py).
    recipe = tiny_recipe(max_steps=STEPS, name="slurm-warned", processes=1)
    recipe["training"]["save_steps"] = 100_000  # checkpoints on; the only one is the warning's
    recipe["data"]["num_workers"] = 2
    job_id = _submit(api, recipe, max_attempts=2)
    _wait_training(api, job_id, 1)
    (first_slurm_job,) = {e["data"]["slurm_job_id"] for e in slurm_events(api, job_id)}
    subprocess.run(
        ["scancel", "--batch", "--signal=USR1", first_slurm_job],
        env=slurm_cluster.env,
        check=True,
        timeout=30,
    )
    job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 240)
    assert job["status"] == "succeeded", (job, worker.log()[-3000:])
    warned, resumed = job["attempts"]
    assert (warned["status"], warned["failure_class"], warned["failure_code"]) == (
        "failed",
        "interrupted",
        "G017",
    )
    # The warned attempt saved a complete checkpoint where it stopped; the retry resumed from it.
    second_dir = Path(resumed["plan"]["run_dir"])
    found = find_resume_point(second_dir).found
    assert found is not None and found.attempt == 1 and incomplete_because(found.path) is None, found
    assert found.step == warned["last_step"] < STEPS, (found, warned)
    assert (resumed["first_step"], resumed["last_step"]) == (found.step + 1, STEPS), resumed
    first_steps, second_steps = _steps(api, job_id, attempt=1), _steps(api, job_id, attempt=2)
    assert first_steps == list(range(1, found.step + 1)), first_steps
    assert second_steps == list(range(found.step + 1, STEPS + 1)), second_steps
    # The retry is a second Slurm job.
    slurm_jobs = {e["data"]["slurm_job_id"] for e in slurm_events(api, job_id)}
    assert len(slurm_jobs) == 2 and first_slurm_job in slurm_jobs, slurm_jobs
