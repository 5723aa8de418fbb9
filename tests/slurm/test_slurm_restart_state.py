"""What a Slurm executor leaves on disk for its restart: its identity (its owner's only, for the same
name and service) and which attempts' ends were not yet reported."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest

from flightdeck.contracts import ClaimedAttempt
from flightdeck.inventory import WorkerInventory, notional_inventory
from flightdeck.launch.plan import build_launch_plan
from flightdeck.recipe.schema import Recipe
from flightdeck.worker.agent.run_attempt import AttemptDescription, write_description
from flightdeck.worker.executors.base import ExecutorSetup
from flightdeck.worker.slurm import commands, restart_state
from flightdeck.worker.slurm.executor import SlurmExecution, SlurmExecutor, SlurmSettings

from ..agent.processes import tiny_recipe


def test_the_identity_is_its_owners_only_and_read_back_for_the_same_name_and_service(tmp_path: Path) -> None:
    path = tmp_path / "state" / "slurm-a.json"
    restart_state.save_identity(
        path,
        name="slurm-a",
        service_url="http://svc:8000",
        worker_id="3",
        token="t0k",
        database="20261127-0a1b2c3d",
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert restart_state.load_identity(path, name="slurm-a", service_url="http://svc:8000") == (
        restart_state.SavedIdentity("3", "t0k", "20261127-0a1b2c3d")
    )
    # Saved before database ids: no database, so every database's folder is searched.
    path.write_text(
        json.dumps({"name": "slurm-a", "service_url": "http://svc:8000", "worker_id": "3", "token": "t"})
    )
    assert restart_state.load_identity(path, name="slurm-a", service_url="http://svc:8000") == (
        restart_state.SavedIdentity("3", "t", "")
    )
    # Another service (a new deployment) or another worker name: not this worker's identity.
    assert restart_state.load_identity(path, name="slurm-a", service_url="http://other:8000") is None
    assert restart_state.load_identity(path, name="slurm-b", service_url="http://svc:8000") is None
    path.write_text("{")  # cut short by a crash
    assert restart_state.load_identity(path, name="slurm-a", service_url="http://svc:8000") is None


def test_two_executors_of_one_name_for_two_services_keep_their_own_identity_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A staging and a production service, each with a Slurm executor named slurm-a on one login node:
    with no --slurm-state-file, each restarted executor is still its own service's worker. An identity
    saved under the earlier default name (the worker's name alone) is still read after an upgrade."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inventory = WorkerInventory(cpu_slots=1, workspace=str(tmp_path), runs_dir=str(tmp_path / "runs"))

    def executor(url: str) -> SlurmExecutor:
        setup = ExecutorSetup(client=None, inventory=inventory, stop=threading.Event(), agent_name="slurm-a")  # type: ignore[arg-type]
        return SlurmExecutor(SlurmSettings(), setup, service_url=url)

    executor("http://staging:8000").remember_identity("3", "staging-token", 10.0, "20261101-aaaaaaaa")
    executor("http://prod:8000").remember_identity("9", "prod-token", 10.0, "20261127-bbbbbbbb")
    assert executor("http://staging:8000").saved_identity() == restart_state.SavedIdentity(
        "3", "staging-token", "20261101-aaaaaaaa"
    )
    assert executor("http://prod:8000").saved_identity() == restart_state.SavedIdentity(
        "9", "prod-token", "20261127-bbbbbbbb"
    )
    assert len(list((tmp_path / "state" / "flightdeck").iterdir())) == 2
    # The earlier release's file, for a third service this executor has not saved under the new name.
    restart_state.save_identity(
        tmp_path / "state" / "flightdeck" / "slurm-a.json",
        name="slurm-a",
        service_url="http://old:8000",
        worker_id="5",
        token="old-token",
        database="",
    )
    upgraded = executor("http://old:8000")
    assert upgraded.saved_identity() == restart_state.SavedIdentity("5", "old-token", "")
    assert executor("http://other:8000").saved_identity() is None
    # Registered again, it saves the identity under the new name and the earlier file (a token) goes.
    upgraded.remember_identity("5", "old-token", 10.0, "20261128-cccccccc")
    assert not (tmp_path / "state" / "flightdeck" / "slurm-a.json").exists()
    assert executor("http://old:8000").saved_identity() == restart_state.SavedIdentity(
        "5", "old-token", "20261128-cccccccc"
    )
    # Another service's executor of that name, registering, leaves an earlier file it does not own.
    earlier = tmp_path / "state" / "flightdeck" / "slurm-a.json"
    restart_state.save_identity(
        earlier, name="slurm-a", service_url="http://old:8000", worker_id="5", token="t", database=""
    )
    executor("http://prod:8000").remember_identity("9", "prod-token", 10.0, "20261127-bbbbbbbb")
    assert earlier.exists()


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
    # Its Slurm job was submitted with the comment of that layout, without a database: looked up by it.
    assert restart_state.database_of(legacy, tmp_path) == ""
    new = _description(tmp_path, 5, "slurm-a", database="20261127-bbbbbbbb")
    assert restart_state.database_of(new, tmp_path) == "20261127-bbbbbbbb"


def test_a_restarted_executor_holds_the_attempts_of_the_database_it_registered_with_with_scancel_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database was reset while the executor ran: the old database's attempt 7 was never settled, the
    new one's attempt 7 runs. Restarted, the executor names attempt 7 once, the new database's, and
    watches the new Slurm job; without a saved database it stops every attempt 7. (scancel is recorded,
    not run: this test needs no Slurm cluster; tests/slurm/test_slurm_restart.py runs the real one.)"""
    runs = tmp_path / "runs"
    old = _description(runs, 7, "slurm-a", database="20261101-aaaaaaaa")
    restart_state.record_slurm_job(old, "41")
    new = _description(runs, 7, "slurm-a", database="20261127-bbbbbbbb")
    restart_state.record_slurm_job(new, "42")
    cancelled: list[str] = []
    monkeypatch.setattr(commands, "cancel", lambda job, env=None: cancelled.append(job))
    monkeypatch.setattr(SlurmExecution, "watch", lambda self: None)  # no squeue to poll here

    def restarted() -> SlurmExecutor:
        inventory = WorkerInventory(cpu_slots=1, workspace=str(tmp_path), runs_dir=str(runs))
        setup = ExecutorSetup(client=None, inventory=inventory, stop=threading.Event(), agent_name="slurm-a")  # type: ignore[arg-type]
        return SlurmExecutor(
            SlurmSettings(state_file=tmp_path / "state.json"), setup, service_url="http://svc"
        )

    executor = restarted()
    executor.remember_identity("3", "t0k", 10.0, "20261127-bbbbbbbb")
    assert executor.held_attempts() == ["7"]
    [adopted] = executor.adopt(keep=["7"], stop=[])
    assert (adopted.run_dir.parent.name, adopted.slurm_job_id) == ("20261127-bbbbbbbb", "42")
    assert cancelled == []

    (tmp_path / "state.json").unlink()  # a first start: both are stopped, each of its own Slurm job
    executor = restarted()
    assert executor.held_attempts() == ["7"]
    assert executor.adopt(keep=[], stop=["7"]) == []
    assert sorted(cancelled) == ["41", "42"]
    assert restart_state.unsettled_attempts(runs, "slurm-a") == []


CLAIMED_AT = 1_764_000_000.125


def scheduled_attempt(runs: Path, database: str) -> tuple[WorkerInventory, ClaimedAttempt]:
    """A Slurm worker's inventory and its attempt 7 of job 1 in `database`, made at CLAIMED_AT, with the
    launch plan the service makes for it."""
    inventory = notional_inventory(2, "cpu").model_copy(
        update={"runs_dir": str(runs), "workspace": str(runs)}
    )
    plan = build_launch_plan(
        Recipe.model_validate(tiny_recipe(max_steps=4)),
        inventory,
        job_id=1,
        database=database,
        attempt_number=1,
        devices=None,
        scheduled=True,
    )
    answer = {"id": 7, "job_id": 1, "number": 1, "recipe": {}, "plan": plan.model_dump(mode="json")}
    return inventory, ClaimedAttempt.model_validate(answer | {"lease_seconds": 30, "claimed_at": CLAIMED_AT})


def test_an_attempt_made_again_with_the_same_id_does_not_inherit_the_earlier_ones_job_directory_with_sbatch_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database restored from a backup makes attempt 7 again, in the same database folder. The earlier
    attempt 7's job directory holds its `settled` mark (a restarted executor would not hold the new one:
    its lease would run out while its job ran on) and its Slurm job id (taken for the new one's if
    sbatch's answer were lost), and node 0's run directory its finish report. All of it moves aside
    before the new job is submitted. (sbatch is recorded, not run: tests/slurm/test_slurm_restart.py
    runs the real one.)"""
    runs = tmp_path / "runs"
    database = "20261127-bbbbbbbb"
    earlier = _description(runs, 7, "slurm-a", database=database)  # claimed_at None: made before
    restart_state.record_slurm_job(earlier, "41")
    restart_state.mark_settled(earlier)
    inventory, attempt = scheduled_attempt(runs, database)
    plan = attempt.plan
    node0 = Path(plan["run_dir"])
    node0.mkdir(parents=True)
    (node0 / "attempt.json").write_text(
        json.dumps({"attempt_id": "7", "claimed_at": None, "state": "finished"})
    )
    (node0 / "finish-report.json").write_text(
        json.dumps({"attempt_id": "7", "report": {"status": "succeeded"}})
    )
    submitted: list[list[str]] = []
    monkeypatch.setattr(commands, "submit", lambda argv, env: submitted.append(argv) or "42")
    client = type("Client", (), {"token": "t0k", "send_events": lambda self, *a, **k: None})()
    setup = ExecutorSetup(client=client, inventory=inventory, stop=threading.Event(), agent_name="slurm-a")  # type: ignore[arg-type]
    executor = SlurmExecutor(
        SlurmSettings(state_file=tmp_path / "state.json"), setup, service_url="http://svc"
    )
    SlurmExecution(executor, attempt)._submit()
    [(job_dir, description)] = restart_state.unsettled_attempts(runs, "slurm-a", database)
    assert job_dir == earlier and description.attempt.claimed_at == 1_764_000_000.125
    assert restart_state.recorded_slurm_job(job_dir) == "42"
    assert (job_dir / "replaced-1" / restart_state.SETTLED_FILE).exists()
    assert restart_state.recorded_slurm_job(job_dir / "replaced-1") == "41"
    assert (
        not (node0 / "finish-report.json").exists() and (node0 / "replaced-1" / "finish-report.json").exists()
    )
    assert (
        f"--comment=flightdeck attempt 7 of job 1 in database {database} made 1764000000.125000"
        in submitted[0]
    )


def test_the_lookup_by_name_takes_the_newest_job_whose_comment_is_the_attempts_with_squeue_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """squeue's `%i %k` lines: comments with spaces, Slurm's `(null)` for none; only an exact comment."""
    comment = "flightdeck attempt 7 of job 1 in database 20261127-bbbbbbbb made 1764000000.125000"
    lines = ["12 (null)", f"13 {comment}", f"15 {comment} x", f"14 {comment}", "junk line", ""]
    asked: list[list[str]] = []
    monkeypatch.setattr(commands, "run", lambda argv, env=None: asked.append(argv) or "\n".join(lines))
    assert commands.job_named("flightdeck-7", comment) == "14"
    assert commands.job_named("flightdeck-7", "flightdeck attempt 7 of job 1") == ""
    assert asked[0][:4] == ["squeue", "-h", "-u", asked[0][3]] and "--me" not in asked[0]
