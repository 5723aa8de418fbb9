"""What a Slurm executor leaves on disk for its restart: its identity (its owner's only, for the same
name and service) and which attempts' ends were not yet reported."""

from __future__ import annotations

import stat
from pathlib import Path

from flightdeck.contracts import ClaimedAttempt
from flightdeck.inventory import WorkerInventory
from flightdeck.worker.agent.run_attempt import AttemptDescription, write_description
from flightdeck.worker.slurm import restart_state


def test_the_identity_is_its_owners_only_and_read_back_for_the_same_name_and_service(tmp_path: Path) -> None:
    path = tmp_path / "state" / "slurm-a.json"
    restart_state.save_identity(
        path, name="slurm-a", service_url="http://svc:8000", worker_id="3", token="t0k"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert restart_state.load_identity(path, name="slurm-a", service_url="http://svc:8000") == (
        restart_state.SavedIdentity("3", "t0k")
    )
    # Another service (a new deployment) or another worker name: not this worker's identity.
    assert restart_state.load_identity(path, name="slurm-a", service_url="http://other:8000") is None
    assert restart_state.load_identity(path, name="slurm-b", service_url="http://svc:8000") is None
    path.write_text("{")  # cut short by a crash
    assert restart_state.load_identity(path, name="slurm-a", service_url="http://svc:8000") is None


def _description(runs: Path, attempt_id: int, agent_name: str, database: str = "20261127-0a1b2c3d") -> Path:
    run_dir = runs / database / "job-1-attempt-1"
    attempt = ClaimedAttempt.model_validate(
        {
            "id": attempt_id,
            "job_id": 1,
            "number": 1,
            "recipe": {},
            "plan": {"run_dir": str(run_dir)},
            "lease_seconds": 30,
        }
    )
    job_dir = restart_state.job_dir(run_dir, str(attempt_id))
    write_description(
        job_dir / restart_state.DESCRIPTION_FILE,
        AttemptDescription(
            service_url="http://svc:8000", attempt=attempt, inventory=WorkerInventory(), agent_name=agent_name
        ),
    )
    return job_dir


def test_unsettled_attempts_are_this_workers_whose_end_was_not_reported(tmp_path: Path) -> None:
    running = _description(tmp_path, 7, "slurm-a")
    restart_state.record_slurm_job(running, "42")
    settled = _description(tmp_path, 8, "slurm-a")
    restart_state.mark_settled(settled)
    _description(tmp_path, 9, "slurm-b")  # another executor sharing the runs directory
    found = restart_state.unsettled_attempts(tmp_path, "slurm-a")
    assert [(d.name, desc.attempt.id) for d, desc in found] == [("7", 7)]
    assert restart_state.recorded_slurm_job(running) == "42"
    assert restart_state.recorded_slurm_job(settled) == ""


def test_an_attempt_of_a_fresh_database_is_not_hidden_by_an_old_databases_settled_mark(
    tmp_path: Path,
) -> None:
    """Attempt ids start again at 1 in a fresh database (the service's data directory reset, the runs
    directory kept): the old database's attempt 7, settled, and the new one's attempt 7, still running,
    have a job directory each, so a restarted executor holds the new one and watches its Slurm job."""
    old = _description(tmp_path, 7, "slurm-a", database="20261101-aaaaaaaa")
    restart_state.record_slurm_job(old, "41")
    restart_state.mark_settled(old)
    new = _description(tmp_path, 7, "slurm-a", database="20261127-bbbbbbbb")
    restart_state.record_slurm_job(new, "42")
    found = restart_state.unsettled_attempts(tmp_path, "slurm-a")
    assert [(d, restart_state.recorded_slurm_job(d)) for d, _ in found] == [(new, "42")]
    assert new == tmp_path / "20261127-bbbbbbbb" / "slurm" / "7"


def test_a_job_directory_of_the_layout_before_database_folders_is_still_found(tmp_path: Path) -> None:
    """An executor upgraded while its Slurm job ran finds it at runs/slurm/<attempt> (its run directory was
    runs/job-<id>-attempt-<n>): not found, the attempt's lease would run out and the job run twice."""
    legacy = _description(tmp_path, 5, "slurm-a", database="")
    assert legacy == tmp_path / "slurm" / "5"
    found = restart_state.unsettled_attempts(tmp_path, "slurm-a")
    assert [(d, desc.attempt.id) for d, desc in found] == [(legacy, 5)]
