"""The lifecycle: a terminal status never changes."""

from __future__ import annotations

import pytest

from service.statuses import IllegalTransition, JobStatus, check_transition


@pytest.mark.parametrize("terminal", [JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled])
@pytest.mark.parametrize("target", list(JobStatus))
def test_terminal_is_final(terminal: JobStatus, target: JobStatus) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(terminal, target)


def test_allowed_path() -> None:
    assert check_transition("queued", "running") is JobStatus.running
    assert check_transition("running", "cancelling") is JobStatus.cancelling
    assert check_transition("running", "queued") is JobStatus.queued
    with pytest.raises(IllegalTransition):
        check_transition("queued", "succeeded")


def test_only_set_status_writes_a_job_status() -> None:
    """Every status change goes through service.jobs.set_status (the claim and the reaper included):
    no other code assigns a job's status or writes it in SQL."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "service"
    assignment = re.compile(r"\bjob\.status\s*=[^=]|UPDATE\s+jobs\s+SET[^;\"']*\bstatus\s*=", re.IGNORECASE)
    writers = [
        (str(path.relative_to(root)), line.strip())
        for path in root.rglob("*.py")
        for line in path.read_text().splitlines()
        if assignment.search(line)
    ]
    assert writers == [("jobs.py", "job.status = check_transition(old, new).value")], writers
