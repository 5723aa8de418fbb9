"""End to end on a real two-node Slurm cluster: a real service, `flightdeck worker --executor slurm`,
sbatch/srun starting the standalone attempt runner on a node, torchrun with 2 gloo ranks training LoRA
on the tiny Llama, metrics and logs shipped by the runner, Slurm's states on the job page."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from flightdeck.worker.checkpoints import incomplete_because

from ..agent.processes import tiny_recipe, wait_until
from ..agent.test_end_to_end import _job, _steps, _submit, _wait_status, _wait_training
from .cluster import NODES, SlurmCluster
from .conftest import occupy_both_nodes, slurm_events

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
_DONE = {"succeeded", "failed", "cancelled"}
SAVE_STEPS = 20


def test_recipe_job_runs_as_one_slurm_job_with_metrics_per_step(on_slurm: Any) -> None:
    service, worker = on_slurm()
    api = service.api()
    job_id = _submit(api, tiny_recipe(max_steps=4, name="slurm-ok"))
    job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 240)
    assert job["status"] == "succeeded", (job, worker.log()[-3000:])
    assert _steps(api, job_id) == [1, 2, 3, 4]
    events = slurm_events(api, job_id)
    slurm_job = events[0]["data"]["slurm_job_id"]
    assert events[0]["message"] == f"Slurm job {slurm_job} submitted"
    running = [e for e in events if e["data"].get("state") == "RUNNING"]
    assert running and running[0]["data"]["nodes"] in NODES, events
    assert job["attempts"][-1]["status"] == "succeeded", job["attempts"]


def test_queued_job_shows_slurms_pending_reason_and_cancel_ends_it(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    service, worker = on_slurm()
    api = service.api()
    # Every CPU of both nodes taken by someone else's job: Flightdeck's job waits in Slurm's queue.
    blocker = occupy_both_nodes(slurm_cluster)
    try:
        job_id = _submit(api, tiny_recipe(max_steps=4, name="slurm-queued"))

        def pending() -> list[dict[str, Any]]:
            return [e for e in slurm_events(api, job_id) if e["data"].get("state") == "PENDING"]

        waits = wait_until(pending, 60, f"a PENDING event\n{worker.log()[-2000:]}")
        assert waits[0]["data"]["reason"] == "Resources", waits
        assert waits[0]["message"].endswith("PENDING (Resources)")
        assert api.post(f"/jobs/{job_id}/cancel").status_code == 202
        job = _wait_status(api, job_id, {"cancelled", "failed", "succeeded"}, 60)
        assert job["status"] == "cancelled", job
        message = job["attempts"][-1]["message"]
        assert "CANCELLED" in message and "no process of it is left" in message, message
    finally:
        subprocess.run(["scancel", blocker], env=slurm_cluster.env, timeout=30)


def test_two_one_node_jobs_run_at_once_one_per_node_and_cancel_leaves_no_process_on_any_node(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    """The partition's two nodes run two jobs of one node each at the same time (the worker offers the
    partition, not one node's worth: worker/agent/free_capacity.py); a cancel of each leaves nothing."""
    service, worker = on_slurm()
    api = service.api()
    # Steps enough to outlive the cancel's way to the executor (its heartbeat): 400 took 10 s here.
    jobs = [_submit(api, tiny_recipe(max_steps=5000, name=f"slurm-cancel-{n}")) for n in (1, 2)]
    for job_id in jobs:
        _wait_training(api, job_id, 1)
    placed = {
        e["data"]["nodes"]
        for job_id in jobs
        for e in slurm_events(api, job_id)
        if e["data"].get("state") == "RUNNING"
    }
    assert placed == set(NODES), placed  # both at once, one on each node
    assert all(slurm_cluster.job_pids(node) for node in NODES), "the jobs' processes run on both nodes"
    for job_id in jobs:
        assert api.post(f"/jobs/{job_id}/cancel").status_code == 202
    for job_id in jobs:
        job = _wait_status(api, job_id, {"cancelled", "failed", "succeeded"}, 60)
        assert job["status"] == "cancelled", (job, worker.log()[-3000:])
        assert "CANCELLED" in job["attempts"][-1]["message"], job["attempts"][-1]
    assert {node: slurm_cluster.job_pids(node) for node in NODES} == {node: [] for node in NODES}


def test_a_failed_node_fails_the_attempt_naming_it_and_the_retry_resumes_from_its_checkpoint_when_the_node_is_back(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    service, worker = on_slurm()
    api = service.api()
    # A job of both nodes: its retry cannot run anywhere until the failed node is back.
    recipe = tiny_recipe(max_steps=5000, name="slurm-node-fail")
    recipe["resources"]["nodes"] = 2
    recipe["training"]["save_steps"] = SAVE_STEPS
    job_id = _submit(api, recipe, max_attempts=2)
    _wait_training(api, job_id, 2 * SAVE_STEPS + 5)  # a checkpoint complete, the next one under way
    slurm_cluster.fail_node("n2")
    try:
        # slurmctld marks the node DOWN after SlurmdTimeout (20 s) and ends the job NODE_FAIL.
        def retried() -> dict[str, Any] | None:
            job = _job(api, job_id)
            return job if len(job["attempts"]) == 2 or job["status"] in _DONE else None

        job = wait_until(retried, 120, f"attempt 2\n{worker.log()[-2000:]}")
        first = job["attempts"][0]
        assert (first["status"], first["failure_class"]) == ("failed", "node_failure"), first
        # The node that failed is named, not the job's whole node list.
        assert "node n2 failed" in first["message"] and "NODE_FAIL" in first["message"], first
        assert first["fix"], first

        def second_job_events(state: str) -> list[dict[str, Any]]:
            jobs = {e["data"]["slurm_job_id"] for e in slurm_events(api, job_id)}
            assert len(jobs) <= 2, jobs
            return [
                e
                for e in slurm_events(api, job_id)
                if e["data"].get("state") == state
                and e["data"]["slurm_job_id"] == max(jobs, key=int)
                and len(jobs) == 2
            ]

        waits = wait_until(lambda: second_job_events("PENDING"), 60, "the retry waiting in Slurm's queue")
        assert not second_job_events("RUNNING"), "the retry ran while its node was down"
        assert waits[0]["message"].endswith(f"({waits[0]['data']['reason']})")
    finally:
        slurm_cluster.restart_slurmd("n2")
    wait_until(lambda: second_job_events("RUNNING"), 60, "the retry running once the node is back")
    # The retry resumes from the failed attempt's last complete checkpoint on the shared runs directory:
    # its first step is that checkpoint's step + 1, not 1.
    retry = wait_until(
        lambda: (a := _job(api, job_id)["attempts"])[-1]["first_step"] and a[-1],
        120,
        "the retry's first step",
    )
    resumed = retry["first_step"] - 1
    assert resumed >= SAVE_STEPS and resumed % SAVE_STEPS == 0, retry
    checkpoint = Path(first["plan"]["run_dir"]) / "output" / "stage-0" / f"checkpoint-{resumed}"
    assert incomplete_because(checkpoint) is None, checkpoint
    assert api.post(f"/jobs/{job_id}/cancel").status_code == 202
    job = _wait_status(api, job_id, _DONE, 60)
    assert job["status"] == "cancelled", job
    assert {node: slurm_cluster.job_pids(node) for node in NODES} == {node: [] for node in NODES}
