"""A Slurm executor killed (SIGKILL) while its Slurm job runs, then restarted: it finds the job again,
the attempt lives on (its lease renewed by the job's runner while the executor is away) and ends once,
with one attempt and one Slurm job; a job that ended meanwhile ends with Slurm's state."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flightdeck.worker.executors.base import ExecutorSetup
from flightdeck.worker.slurm import restart_state
from flightdeck.worker.slurm.executor import SlurmExecution, SlurmExecutor, SlurmSettings, job_comment

from ..agent.processes import tiny_recipe, wait_until
from ..agent.test_end_to_end import _job, _steps, _submit, _wait_status, _wait_training
from .cluster import SlurmCluster
from .conftest import occupy_both_nodes, slurm_events
from .test_slurm_restart_state import CLAIMED_AT, scheduled_attempt

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
_DONE = {"succeeded", "failed", "cancelled"}
# Short, so that the executor's absence outlasts several leases within the test.
LEASE_SECONDS = 3.0


def _slurm_state(cluster: SlurmCluster, slurm_job: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", slurm_job, "-o", "%T"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return out.strip()


def test_a_restarted_executor_adopts_its_running_slurm_job(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    service, worker = on_slurm(FLIGHTDECK_LEASE_SECONDS=str(LEASE_SECONDS))
    api = service.api()
    # The training must outlast the executor's absence (two leases, ~8 s with the checks): 1,000 steps
    # took 20-30 s on 2 quiet cores (200 steps, once thought enough, ended first there) and longer under load.
    steps = 1000
    job_id = _submit(api, tiny_recipe(max_steps=steps, name="slurm-adopt"))
    _wait_training(api, job_id, 1)
    worker.kill()  # SIGKILL: no goodbye, no state written on the way out
    slurm_job = slurm_events(api, job_id)[0]["data"]["slurm_job_id"]
    time.sleep(2 * LEASE_SECONDS)
    # Two leases without the executor: the attempt lives, because its job does.
    assert _slurm_state(slurm_cluster, slurm_job) == "RUNNING", "the job ended before the restart"
    assert [a["status"] for a in _job(api, job_id)["attempts"]] == ["running"]
    worker.start()
    restarted = time.monotonic()
    job = _wait_status(api, job_id, _DONE, 420)
    print(f"restart to the end: {time.monotonic() - restarted:.1f} s")
    assert job["status"] == "succeeded", (job, worker.log()[-3000:])
    assert [a["status"] for a in job["attempts"]] == ["succeeded"]
    assert _steps(api, job_id) == list(range(1, steps + 1))  # once per step
    events = slurm_events(api, job_id)
    assert {e["data"]["slurm_job_id"] for e in events} == {slurm_job}, events  # never submitted twice
    found_again = f"Slurm job {slurm_job} found again by the restarted executor"
    assert [e["message"] for e in events].count(found_again) == 1, events


def test_a_restarted_executor_cancels_the_slurm_job_of_an_attempt_ended_while_it_was_away(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    service, worker = on_slurm()
    api = service.api()
    # Both nodes held by someone else's job: Flightdeck's Slurm jobs wait in Slurm's queue (no training).
    blocker = occupy_both_nodes(slurm_cluster)
    try:
        job_id = _submit(api, tiny_recipe(max_steps=4, name="slurm-stale"), max_attempts=2)

        def slurm_jobs() -> list[str]:
            return sorted({e["data"]["slurm_job_id"] for e in slurm_events(api, job_id)}, key=int)

        first = wait_until(slurm_jobs, 60, f"a Slurm job\n{worker.log()[-2000:]}")[0]
        worker.kill()
        # While the executor is away its worker is revoked: the attempt is lost and the job requeued.
        (listed,) = api.get("/workers").json()
        assert api.post(f"/workers/{listed['id']}/revoke").status_code == 200
        assert _job(api, job_id)["attempts"][0]["failure_class"] == "lease_lost"
        worker.start()
        # The stale Slurm job is cancelled, and the retry is a new Slurm job: never both.
        wait_until(lambda: _slurm_state(slurm_cluster, first) == "CANCELLED", 60, f"scancel {first}")
        second = wait_until(lambda: slurm_jobs()[1:], 60, f"the retry's Slurm job\n{worker.log()[-2000:]}")
        assert len(slurm_jobs()) == 2 and _slurm_state(slurm_cluster, second[0]) == "PENDING"
    finally:
        subprocess.run(["scancel", blocker], env=slurm_cluster.env, timeout=30)
    assert api.post(f"/jobs/{job_id}/cancel").status_code == 202
    assert _wait_status(api, job_id, _DONE, 60)["status"] == "cancelled"


def test_a_job_whose_sbatch_answer_was_lost_is_found_by_its_database_not_by_its_name_alone(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor submitted attempt 7's Slurm job but sbatch's answer was lost (no job id recorded), so
    restarted it looks the job up by name. Another database's attempt 7 (a fresh database, another
    service on the cluster) has the same name, `flightdeck-7`, and the newer job: the comment tells them
    apart. Real sbatch, squeue and scancel; the jobs are held, so nothing runs."""
    runs = tmp_path / "runs"
    ours, other = "20261127-aaaaaaaa", "20261127-bbbbbbbb"
    inventory, attempt = scheduled_attempt(runs, ours)
    monkeypatch.setattr(SlurmExecution, "watch", lambda self: None)  # the jobs are held: nothing to follow

    def executor() -> SlurmExecutor:
        client = SimpleNamespace(token="t0k", send_events=lambda *args, **kwargs: None)
        setup = ExecutorSetup(
            client=client, inventory=inventory, stop=threading.Event(), agent_name="slurm-a"
        )  # type: ignore[arg-type]
        settings = SlurmSettings(
            state_file=tmp_path / "state.json",
            env={"SLURM_CONF": str(slurm_cluster.conf)},
            extra_options=["--hold"],
        )
        return SlurmExecutor(settings, setup, service_url="http://svc")

    first = executor()
    first.remember_identity("3", "t0k", 10.0, ours)
    submitted = SlurmExecution(first, attempt)
    submitted._submit()
    mine = submitted.slurm_job_id
    (submitted.job_dir / restart_state.SLURM_JOB_ID_FILE).unlink()  # the answer that was lost
    argv = ["sbatch", "--parsable", "--hold", "--job-name=flightdeck-7", "--output=/dev/null"]
    argv += [f"--comment={job_comment('7', '1', other, CLAIMED_AT)}", "--wrap", "true"]
    theirs = subprocess.run(
        argv, env=slurm_cluster.env, capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        restarted = executor()
        assert restarted.held_attempts() == ["7"]
        [adopted] = restarted.adopt(keep=["7"], stop=[])
        assert adopted.slurm_job_id == mine, (mine, theirs)
        # The service stopped attempt 7 meanwhile: its own job is cancelled, the other database's is not.
        restarted.held_attempts()
        restarted.adopt(keep=[], stop=["7"])
        wait_until(lambda: _slurm_state(slurm_cluster, mine) == "CANCELLED", 30, f"scancel {mine}")
        assert _slurm_state(slurm_cluster, theirs) == "PENDING"
        assert restart_state.unsettled_attempts(runs, "slurm-a", ours) == []
    finally:
        subprocess.run(["scancel", mine, theirs], env=slurm_cluster.env, timeout=30)
