"""How attempts end: a worker's finish report for its node(s), the attempt's end once every node has
ended, the job moved on accordingly (succeeded, requeued, failed, cancelled), and a claim handed back
before it began."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete
from sqlmodel import Session, col, select

from flightdeck.contracts import INTERRUPTED, AttemptNotRunning, FinishReport
from flightdeck.service.core.db import Database
from flightdeck.service.core.tables import attempt_nodes
from flightdeck.service.gangs.gather import undeliver
from flightdeck.service.gangs.nodes import finish_node, nodes_of, outcome
from flightdeck.service.lifecycle import end_attempt, set_status
from flightdeck.service.models import Attempt, Event, Job, LogChunk, MetricKey
from flightdeck.service.reports.metric_ingest import forget_attempt
from flightdeck.statuses import NODE_ACTIVE, AttemptStatus, JobStatus, NodeStatus


@dataclass(frozen=True)
class RetryPolicy:
    """Which attempt failures put a job back in the queue (while attempts remain)."""

    # node_failure and preempted: a cluster scheduler (Slurm) ended the attempt from outside; the job's
    # next attempt waits in its queue until nodes are back (worker/slurm/states.py). interrupted: the
    # trainer saved a checkpoint and stopped on a signal (G017); the retry resumes.
    retry_on: frozenset[str] = frozenset({"lease_lost", "node_failure", "preempted", INTERRUPTED})


RETRY = RetryPolicy()


class NotReleasable(Exception):
    """The attempt has begun (a report arrived) or ended: it ends by finishing or by its lease."""


@contextlib.contextmanager
def locked(db: Database, attempt_id: int) -> Iterator[tuple[Session, Attempt, Job] | None]:
    """A write transaction holding the attempt's and its job's rows locked (attempt first, then job: the
    order every writer of both takes, so two service processes never wait on each other in a cycle);
    None: no such attempt."""
    with db.write() as session:
        attempt = session.get(Attempt, attempt_id, with_for_update=True)
        if attempt is None:
            yield None
            return
        job = session.get(Job, attempt.job_id, with_for_update=True)
        assert job is not None and attempt.id is not None
        yield session, attempt, job


def release_attempt(db: Database, attempt_id: int) -> Job | None:
    """Undo a claim whose answer never reached a running agent (the client went away, or the agent was
    stopping): the attempt, its nodes and its claim event are removed and the job is queued again with
    the attempt count it had, so a dropped answer costs no attempt. None: no such attempt. Only an
    attempt whose nodes are all one worker's is released: a gang's other members hold theirs."""
    now = time.time()
    with locked(db, attempt_id) as found:
        if found is None:
            return None
        session, attempt, job = found
        nodes = nodes_of(session.connection(), attempt_id)
        if len({n.worker_id for n in nodes}) > 1:
            raise NotReleasable(
                f"attempt {attempt_id} has several workers' nodes; a node that will not run ends with its lease"
            )
        reported = session.exec(
            select(Event.id).where(Event.attempt_id == attempt.id, Event.kind != "status").limit(1)
        ).first()
        points = session.exec(
            select(MetricKey.key).where(MetricKey.attempt_id == attempt.id).limit(1)
        ).first()
        chunks = session.exec(
            select(LogChunk.offset).where(LogChunk.attempt_id == attempt.id).limit(1)
        ).first()
        current = job.current_attempt_id == attempt.id and job.status == JobStatus.running.value
        if attempt.status != AttemptStatus.running.value or not current or reported or points or chunks:
            raise NotReleasable(
                f"attempt {attempt_id} has begun or ended ({attempt.status}); it cannot be handed back"
            )
        for event in session.exec(select(Event).where(Event.attempt_id == attempt.id)).all():
            session.delete(event)
        session.execute(delete(attempt_nodes).where(attempt_nodes.c.attempt_id == attempt_id))
        session.delete(attempt)
        forget_attempt(db, attempt_id)
        session.flush()
        earlier = session.exec(
            select(Attempt.id).where(Attempt.job_id == job.id).order_by(col(Attempt.number).desc()).limit(1)
        ).first()
        job.attempt_count -= 1
        job.current_attempt_id = earlier
        job.worker_name = None
        if job.attempt_count == 0:
            job.started_at = None
        set_status(
            session, job, JobStatus.queued, now, "the claim's answer did not reach its agent: queued again"
        )
    return job


def hand_back_claim(db: Database, attempt_id: int, worker_id: int) -> None:
    """A claim's answer did not reach its agent: an attempt of this worker alone is released
    (`release_attempt`); the worker's node of a gang is handed over on its next claim instead, as the
    other members hold theirs."""
    with db.writing() as conn:
        holders = {n.worker_id for n in nodes_of(conn, attempt_id)}
        if len(holders) > 1:
            undeliver(conn, attempt_id, worker_id)
            return
    release_attempt(db, attempt_id)


def finish_attempt(
    db: Database, attempt_id: int, report: FinishReport, worker_id: int | None = None
) -> tuple[Job, Attempt] | None:
    """Record how the worker's node(s) of an attempt ended, and once every node has (service/gangs/nodes.py
    `outcome`: at once for an attempt of one worker), end the attempt and move its job on; repeating the
    same report changes nothing. `worker_id`: the reporting worker (None: the attempt's own).
    """
    now = time.time()
    with locked(db, attempt_id) as found:
        if found is None:
            return None
        session, attempt, job = found
        conn = session.connection()
        before = finish_node(conn, attempt_id, worker_id or attempt.worker_id or 0, report, now)
        if before is None:
            return None
        if before not in NODE_ACTIVE:
            if before == report.status or (before == NodeStatus.lost and report.status == "cancelled"):
                return job, attempt
            if attempt.stop_code and report.status == "cancelled":
                return job, attempt
            raise AttemptNotRunning(attempt.status if attempt.status != AttemptStatus.running else before)
        combined = outcome(conn, attempt_id) if attempt.status == AttemptStatus.running else None
        if combined is None:
            return job, attempt  # other nodes still run; the heartbeat stops them if this one failed
        if attempt.stop_code is not None and combined.status == "cancelled":
            combined = stopped_by_service(attempt, combined)
        end_with_report(session, job, attempt, combined, now)
        return job, attempt


def end_with_report(session: Any, job: Job, attempt: Attempt, report: FinishReport, now: float) -> None:
    """The attempt ends as `report` says (`lost` when its lease ran out) and its job moves on."""
    new = AttemptStatus.lost if report.failure_class == "lease_lost" else AttemptStatus(report.status)
    values: dict[str, Any] = {"finished_at": now}
    for name in ("exit_code", "failure_class", "failure_code", "message", "fix", "log_tail", "output_path"):
        values[name] = getattr(report, name)
    values["findings"] = [f.model_dump(mode="json") for f in report.findings]
    end_attempt(session, attempt, new, values)
    _end_job(session, job, attempt, report, now)


def stopped_by_service(attempt: Attempt, report: FinishReport) -> FinishReport:
    """An attempt the service stopped for a health finding failed with that finding, not 'cancelled'."""
    code, message = attempt.stop_code, attempt.stop_message
    fix = "look at the last log lines for where the run hung (data loading, a collective, I/O)"
    if report.ranks:
        # The agent read every rank's stack before stopping them (H006 when they were apart).
        message = f"{message}; where the ranks were: {report.ranks}"
        fix = "the stacks name where each rank waited; every rank's whole stack is in the log"
        if report.ranks_apart:
            code = "H006"
            fix = (
                "one rank is busy alone (evaluating, tokenising, saving on rank 0) while the others wait in "
                "a collective: run that work on every rank, before the process group starts, or out of the "
                "collective's way; every rank's whole stack is in the log"
            )
    return report.model_copy(
        update={
            "status": "failed",
            "failure_class": f"health:{code}",
            "failure_code": code,
            "message": message,
            "fix": fix,
        }
    )


def _end_job(session: Any, job: Job, attempt: Attempt, report: FinishReport, now: float) -> None:
    job.failure_class = report.failure_class
    job.failure_code = report.failure_code
    job.failure_message = report.message
    job.failure_fix = report.fix
    if report.status == "succeeded":
        job.output_path = report.output_path
        job.failure_class = job.failure_code = job.failure_message = job.failure_fix = None
        set_status(session, job, JobStatus.succeeded, now, f"attempt {attempt.number} succeeded")
    elif report.status == "cancelled" or job.status == JobStatus.cancelling:
        set_status(session, job, JobStatus.cancelled, now, f"attempt {attempt.number} stopped")
    elif report.failure_class in RETRY.retry_on and job.attempt_count < job.max_attempts:
        set_status(session, job, JobStatus.queued, now, f"requeued after {report.failure_class}")
    else:
        code = f" {report.failure_code}" if report.failure_code else ""
        set_status(
            session,
            job,
            JobStatus.failed,
            now,
            f"attempt {attempt.number} failed: {report.failure_class}{code}",
        )
