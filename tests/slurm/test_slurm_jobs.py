"""End to end on a real two-node Slurm cluster: a real service, `flightdeck worker --executor slurm`,
sbatch/srun starting the standalone attempt runner on a node, torchrun with 2 gloo ranks training LoRA
on the tiny Llama, metrics and logs shipped by the runner, Slurm's states on the job page."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from ..agent.processes import tiny_recipe, wait_until
from ..agent.test_end_to_end import _steps, _submit, _wait_status, _wait_training
from .cluster import NODES, SlurmCluster
from .conftest import slurm_events

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


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
    blocker = subprocess.run(
        ["sbatch", "--parsable", "-N2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 120"],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
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


def test_cancel_of_a_running_slurm_job_leaves_no_process_on_any_node(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    service, worker = on_slurm()
    api = service.api()
    job_id = _submit(api, tiny_recipe(max_steps=400, name="slurm-cancel"))
    _wait_training(api, job_id, 1)
    assert any(slurm_cluster.job_pids(node) for node in NODES), "the job's processes run on a node"
    assert api.post(f"/jobs/{job_id}/cancel").status_code == 202
    job = _wait_status(api, job_id, {"cancelled", "failed", "succeeded"}, 60)
    assert job["status"] == "cancelled", (job, worker.log()[-3000:])
    assert "CANCELLED" in job["attempts"][-1]["message"], job["attempts"][-1]
    assert {node: slurm_cluster.job_pids(node) for node in NODES} == {node: [] for node in NODES}


def test_a_failed_node_fails_the_attempt_as_a_node_failure_naming_it(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    service, worker = on_slurm()
    api = service.api()
    job_id = _submit(api, tiny_recipe(max_steps=5000, name="slurm-node-fail"))
    _wait_training(api, job_id, 1)
    node = next(e["data"]["nodes"] for e in slurm_events(api, job_id) if e["data"].get("state") == "RUNNING")
    slurm_cluster.fail_node(node)
    try:
        # slurmctld marks the node DOWN after SlurmdTimeout (20 s) and ends the job NODE_FAIL.
        job = _wait_status(api, job_id, {"failed", "succeeded", "cancelled"}, 120)
        attempt = job["attempts"][-1]
        assert (job["status"], attempt["failure_class"]) == ("failed", "node_failure"), (
            attempt,
            worker.log()[-2000:],
        )
        assert f"node {node} failed" in attempt["message"] and "NODE_FAIL" in attempt["message"], attempt
        assert attempt["fix"], attempt
    finally:
        slurm_cluster.restart_slurmd(node)
