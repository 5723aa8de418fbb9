"""A run directory that an earlier attempt used: a database restored from a backup hands out the same job
and attempt ids again, in its own folder, so the same path and even the same attempt id arrive again.
Only the moment the service made the attempt (`claimed_at`) tells them apart."""

from __future__ import annotations

import json
from pathlib import Path

from flightdeck.worker.agent import rundir
from flightdeck.worker.checkpoints import find_resume_point, mark_complete


def _attempt(attempt_id: int, claimed_at: float | None) -> dict[str, object]:
    return {"attempt_id": str(attempt_id), "job_id": "1", "number": 1, "claimed_at": claimed_at}


def _run(run_dir: Path, attempt: dict[str, object], steps: int) -> None:
    """What a run leaves: its steps in metrics.jsonl, its log, a rank's end marker, a complete checkpoint
    under output/."""
    rundir.prepare_run_dir(run_dir, attempt, {}, {})
    with (run_dir / "metrics.jsonl").open("a") as metrics:
        metrics.writelines(json.dumps({"type": "step", "step": s}) + "\n" for s in range(1, steps + 1))
    (run_dir / "output.log").write_text(f"attempt {attempt['attempt_id']}\n")
    (run_dir / "script-end-rank0.json").write_text('{"rank": 0, "exit_code": 0}')
    checkpoint = run_dir / "output" / "stage-0" / f"checkpoint-{steps}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.bin").write_bytes(b"x")
    mark_complete(checkpoint, steps)


def test_the_same_attempt_id_made_again_starts_clean_and_the_earlier_files_are_set_aside(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "20261127-0a1b2c3d" / "job-1-attempt-1"
    _run(run_dir, _attempt(6, 1_700_000_000.25), steps=3)  # before the backup was restored
    rundir.prepare_run_dir(run_dir, _attempt(6, 1_700_000_900.5), {}, {})  # the restored database's 6
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "attempt.json",
        "output",
        "plan.json",
        "recipe.json",
        "replaced-1",
    ]  # no metrics, log or end marker of the earlier run (the agent would take it for this run's end)
    assert list((run_dir / "output").iterdir()) == []
    kept = run_dir / "replaced-1"
    assert (kept / "output" / "stage-0" / "checkpoint-3" / "model.bin").read_bytes() == b"x"  # its model
    assert (kept / "metrics.jsonl").read_text().count("\n") == 3 and (kept / "script-end-rank0.json").exists()
    # A retry of the restored job does not resume from the other timeline's checkpoint.
    assert find_resume_point(run_dir.with_name("job-1-attempt-2")).found is None
    # A second replacement takes the next name.
    _run(run_dir, _attempt(6, 1_700_000_900.5), steps=2)
    rundir.prepare_run_dir(run_dir, _attempt(6, 1_700_009_000.0), {}, {})
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("replaced-")) == [
        "replaced-1",
        "replaced-2",
    ]
    assert (run_dir / "replaced-2" / "output" / "stage-0" / "checkpoint-2").is_dir()


def test_the_same_attempt_prepared_again_keeps_what_it_wrote(tmp_path: Path) -> None:
    run_dir = tmp_path / "job-1-attempt-1"
    _run(run_dir, _attempt(6, 1_700_000_000.25), steps=3)
    rundir.prepare_run_dir(run_dir, _attempt(6, 1_700_000_000.25), {}, {})
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 3
    assert (run_dir / "output" / "stage-0" / "checkpoint-3").is_dir()
    assert not any(p.name.startswith("replaced-") for p in run_dir.iterdir())


def test_a_retry_does_not_resume_from_a_sibling_the_other_timeline_left_on_this_host(tmp_path: Path) -> None:
    """The restored database's job 1 ran attempt 1 on another host; this host still holds attempt 1 of the
    lost timeline (the same name, never prepared again here). Its retry, attempt 2, runs here: the
    sibling's attempt.json names another start of the job, so its checkpoint is another run's."""
    database = tmp_path / "20261127-0a1b2c3d"
    lost = database / "job-1-attempt-1"
    _run(lost, {**_attempt(6, 1_700_000_000.25), "job_started_at": 1_700_000_000.25}, steps=3)
    retry = database / "job-1-attempt-2"
    # This timeline's job 1 first started at another moment: the lost attempt is not searched.
    assert find_resume_point(retry, job_started_at=1_700_000_900.5).found is None
    # The job's own attempt 1 is searched, whatever its claimed_at: a service replica whose clock is
    # behind may have made it "before" the job's start (nothing compares clocks).
    assert find_resume_point(retry, job_started_at=1_700_000_000.25).found is not None
    rundir.write_json(
        lost / "attempt.json", _attempt(6, 1_699_999_000.0) | {"job_started_at": 1_700_000_900.5}
    )
    assert find_resume_point(retry, job_started_at=1_700_000_900.5).found is not None
    # A directory that does not say which start of the job it belongs to (an earlier release wrote it) is
    # searched, and so is every sibling for a service that sends no job_started_at.
    rundir.write_json(lost / "attempt.json", _attempt(6, 1_700_000_000.25))
    assert find_resume_point(retry, job_started_at=1_700_000_900.5).found is not None
    rundir.write_json(lost / "attempt.json", _attempt(6, 1_700_000_000.25) | {"job_started_at": 1.0})
    assert find_resume_point(retry).found is not None
