"""Job and attempt statuses, and the one place that decides which changes are allowed."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    def is_terminal(self) -> bool:
        return self in TERMINAL_JOB


class AttemptStatus(StrEnum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    lost = "lost"

    def is_terminal(self) -> bool:
        return self is not AttemptStatus.running


TERMINAL_JOB = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})

_ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.queued: frozenset({JobStatus.running, JobStatus.cancelled, JobStatus.failed}),
    # running -> queued is a requeue after a lost lease or a retryable failure.
    JobStatus.running: frozenset(
        {JobStatus.queued, JobStatus.cancelling, JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled}
    ),
    JobStatus.cancelling: frozenset({JobStatus.cancelled, JobStatus.failed, JobStatus.succeeded}),
}


class IllegalTransition(Exception):
    """A status change the lifecycle forbids, above all leaving a terminal status."""


def check_transition(current: JobStatus | str, new: JobStatus | str) -> JobStatus:
    """Return `new` if a job may go from `current` to it; raise IllegalTransition otherwise."""
    current, new = JobStatus(current), JobStatus(new)
    if current.is_terminal():
        raise IllegalTransition(f"job is {current.value}, a terminal status; it cannot become {new.value}")
    if new not in _ALLOWED[current]:
        raise IllegalTransition(f"a {current.value} job cannot become {new.value}")
    return new


def sources_for(new: JobStatus) -> list[str]:
    """Statuses a job may be in for a change to `new` (used in guarded UPDATE ... WHERE status IN)."""
    return [s.value for s, targets in _ALLOWED.items() if new in targets]
