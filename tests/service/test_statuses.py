"""The lifecycle: a terminal status never changes."""

from __future__ import annotations

import pytest

from flightdeck.statuses import IllegalTransition, JobStatus, check_transition


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
