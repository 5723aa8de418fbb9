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


def test_only_change_status_writes_a_job_status() -> None:
    """Every status change goes through service.jobs.change_statuses (the claim and the reaper included):
    no other code assigns a job's status, and the only other UPDATE of jobs (ingestion's progress)
    leaves the status alone."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "service"
    sources = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.py")}
    assert [name for name, text in sources.items() if re.search(r"\bjob\.status\s*=[^=]", text)] == []
    raw_sql = [n for n, text in sources.items() if re.search(r"UPDATE\s+jobs", text, re.IGNORECASE)]
    assert raw_sql == ["jobs.py"], raw_sql  # its docstring: the guarded UPDATE it builds
    # update(jobs...) or many_rows_update(dialect, jobs...): the Core statements that change jobs' rows.
    writes_jobs = re.compile(r"\bupdate\(jobs|many_rows_update\(\w+, jobs")
    updates = sorted(name for name, text in sources.items() if writes_jobs.search(text))
    assert updates == ["jobs.py", "reports/metric_ingest.py"], updates
    progress = sources["reports/metric_ingest.py"].split("update(jobs", 1)[1].split("\n)\n", 1)[0]
    assert "last_step" in progress and "status" not in progress
