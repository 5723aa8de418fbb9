"""Workers, leases and the end of attempts (claims are in service/claims.py).

Leases are timestamps renewed by heartbeats; expired ones are found by a query, never by in-memory
timers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlmodel import col, select

from service.contracts import INTERRUPTED, AttemptNotRunning, FinishReport
from service.core.db import Database
from service.gangs import (
    NODE_ACTIVE,
    attempts_with_expired_nodes,
    expire_nodes,
    finish_node,
    holds_node,
    nodes_of,
    outcome,
    renew_node,
    set_node_leases,
    stopping_reason,
    undeliver,
)
from service.inventory import WorkerInventory
from service.jobs import set_status
from service.models import Attempt, Event, Job, LogChunk, MetricKey, Worker
from service.reports.metric_ingest import forget_attempt
from service.statuses import AttemptStatus, JobStatus
from service.worker_identity import new_worker_token


@dataclass(frozen=True)
class RetryPolicy:
    """Which attempt failures put a job back in the queue (while attempts remain)."""

    # interrupted: the trainer saved a checkpoint and stopped on a signal (G017); the retry resumes.
    retry_on: frozenset[str] = frozenset({"lease_lost", INTERRUPTED})


RETRY = RetryPolicy()


class NameTaken(Exception):
    """Another live worker holds this name: registering must not take it over."""


class NotThisWorker(Exception):
    """The caller's token belongs to another worker."""


def register_worker(
    db: Database,
    name: str,
    inventory: WorkerInventory,
    *,
    caller: int | None,
    lease_seconds: float,
) -> tuple[Worker, str]:
    """Register (or refresh) a worker and issue its own token: (worker, token), the token shown once.

    `caller` is the worker the request authenticated as (None: the enrolment token). A worker may
    re-register itself (its token is replaced). The enrolment token takes a name that is free, revoked,
    or held by a worker silent for longer than a lease (a restarted agent); a live worker's name is
    never taken over.
    """
    now = time.time()
    token, token_hash = new_worker_token()
    with db.write() as session:
        worker = session.exec(select(Worker).where(Worker.name == name)).first()
        if caller is not None and (worker is None or worker.id != caller):
            raise NotThisWorker(f"this token belongs to worker {caller}, not to '{name}'")
        live = (
            worker is not None and worker.token_hash is not None and now - worker.last_seen_at < lease_seconds
        )
        if caller is None and live:
            raise NameTaken(
                f"worker '{name}' is registered and alive; register under another name, or revoke it first "
                f"(flightdeck workers revoke {name})"
            )
        if worker is None:
            worker = Worker(name=name, inventory={}, registered_at=now, last_seen_at=now)
        worker.inventory = inventory.model_dump(mode="json")
        worker.last_seen_at = now
        worker.token_hash = token_hash
        session.add(worker)
        session.flush()
    return worker, token


def revoke_worker(db: Database, worker_id: int) -> Worker | None:
    """The worker's token stops working; its running attempts are lost as for an expired lease."""
    now = time.time()
    with db.write() as session:
        worker = session.get(Worker, worker_id)
        if worker is None:
            return None
        worker.token_hash = None
        session.add(worker)
        for attempt in session.exec(
            select(Attempt).where(
                Attempt.worker_id == worker_id, Attempt.status == AttemptStatus.running, Attempt.nnodes == 1
            )
        ).all():
            attempt.lease_expires_at = now - 1
            session.add(attempt)
        set_node_leases(session.connection(), now - 1, worker_id=worker_id)
    reap_expired_leases(db, now)
    return worker


def heartbeat(db: Database, worker_id: int, attempt_ids: list[int], lease_seconds: float) -> list[int] | None:
    """Extend the leases of the worker's running attempts; return the ones it must stop (None: no worker)."""
    now = time.time()
    with db.write() as session:
        worker = session.get(Worker, worker_id)
        if worker is None:
            return None
        worker.last_seen_at = now
        session.add(worker)
        cancel: list[int] = []
        if not attempt_ids:
            return cancel
        rows = session.exec(select(Attempt, Job).join(Job).where(col(Attempt.id).in_(attempt_ids))).all()
        known = set()
        for attempt, job in rows:
            known.add(attempt.id)
            if attempt.nnodes > 1:
                if _beat_node(session.connection(), attempt, job, worker_id, now + lease_seconds):
                    cancel.append(attempt.id)  # type: ignore[arg-type]
                continue
            if attempt.status != AttemptStatus.running or attempt.worker_id != worker_id:
                cancel.append(attempt.id)  # type: ignore[arg-type]
                continue
            attempt.lease_expires_at = now + lease_seconds
            session.add(attempt)
            if job.status == JobStatus.cancelling or attempt.stop_code is not None:
                cancel.append(attempt.id)  # type: ignore[arg-type]
        cancel.extend(a for a in attempt_ids if a not in known)
        return sorted(set(cancel))


def _beat_node(conn: Any, attempt: Attempt, job: Job, worker_id: int, until: float) -> bool:
    """Renew this worker's node of a multi-node attempt; True when the node must stop: the attempt
    ended, the job is being cancelled, the service stopped it, or another node ended without success
    (its ranks are gone, so these would wait in a collective)."""
    assert attempt.id is not None
    if holds_node(conn, attempt.id, worker_id) is None:
        return True
    renew_node(conn, attempt.id, worker_id, until)
    return (
        attempt.status != AttemptStatus.running
        or job.status == JobStatus.cancelling
        or attempt.stop_code is not None
        or stopping_reason(nodes_of(conn, attempt.id)) is not None
    )


class NotReleasable(Exception):
    """The attempt has begun (a report arrived) or ended: it ends by finishing or by its lease."""


def _locked(session: Any, attempt_id: int) -> tuple[Attempt, Job] | None:
    """The attempt and its job, both rows locked for this transaction (attempt first, then job: the
    order every writer of both takes, so two service processes never wait on each other in a cycle)."""
    attempt = session.get(Attempt, attempt_id, with_for_update=True)
    if attempt is None:
        return None
    job = session.get(Job, attempt.job_id, with_for_update=True)
    assert job is not None and attempt.id is not None
    return attempt, job


def release_attempt(db: Database, attempt_id: int) -> Job | None:
    """Undo a claim whose answer never reached a running agent (the client went away, or the agent was
    stopping): the attempt and its claim event are removed and the job is queued again with the
    attempt count it had, so a dropped answer costs no attempt. None: no such attempt."""
    now = time.time()
    with db.write() as session:
        found = _locked(session, attempt_id)
        if found is None:
            return None
        attempt, job = found
        if attempt.nnodes > 1:
            raise NotReleasable(
                f"attempt {attempt_id} has several nodes; a node that will not run ends with its lease"
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


def hand_back_node(db: Database, attempt_id: int, worker_id: int) -> None:
    """A node's claim answer did not reach its agent: its next claim gets the node again."""
    with db.writing() as conn:
        undeliver(conn, attempt_id, worker_id)


def finish_attempt(
    db: Database, attempt_id: int, report: FinishReport, worker_id: int | None = None
) -> tuple[Job, Attempt] | None:
    """Record how an attempt ended and move its job on; repeating the same report changes nothing.

    A node of a multi-node attempt (`worker_id` names it) reports its own end; the attempt ends when
    every node has (service/gangs.py `outcome`).
    """
    now = time.time()
    with db.write() as session:
        found = _locked(session, attempt_id)
        if found is None:
            return None
        attempt, job = found
        if attempt.nnodes > 1:
            assert worker_id is not None
            conn = session.connection()
            before = finish_node(conn, attempt_id, worker_id, report, now)
            if before not in NODE_ACTIVE:
                if before == report.status or (before == "lost" and report.status == "cancelled"):
                    return job, attempt
                raise AttemptNotRunning(before)
            combined = outcome(conn, attempt_id) if attempt.status == AttemptStatus.running else None
            if combined is None:
                return job, attempt  # other nodes still run; the heartbeat stops them if this one failed
            report = combined
        if attempt.status != AttemptStatus.running:
            if attempt.status == report.status or (attempt.stop_code and report.status == "cancelled"):
                return job, attempt
            raise AttemptNotRunning(attempt.status)
        if attempt.stop_code is not None and report.status == "cancelled":
            report = stopped_by_service(attempt, report)
        _end_attempt(session, job, attempt, report, now)
        return job, attempt


def _end_attempt(session: Any, job: Job, attempt: Attempt, report: FinishReport, now: float) -> None:
    """The attempt ends as `report` says (`lost` when its lease ran out) and its job moves on."""
    attempt.status = AttemptStatus.lost.value if report.failure_class == "lease_lost" else report.status
    attempt.finished_at = now
    attempt.lease_expires_at = None
    for name in ("exit_code", "failure_class", "failure_code", "message", "fix", "log_tail", "output_path"):
        setattr(attempt, name, getattr(report, name))
    attempt.findings = [f.model_dump(mode="json") for f in report.findings]
    session.add(attempt)
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


def lease_lost(what: str) -> FinishReport:
    """The report of an attempt (or a node of one) whose worker stopped sending heartbeats."""
    return FinishReport(
        status="failed",
        failure_class="lease_lost",
        message=f"no heartbeat from the worker before the {what} expired",
        fix="check the worker host; the job is retried while attempts remain",
    )


def reap_expired_leases(db: Database, now: float | None = None) -> list[int]:
    """Attempts whose lease ran out are lost: their jobs are requeued, cancelled or failed lease_lost."""
    now = now or time.time()
    with db.write() as session:
        expired = session.exec(
            select(Attempt)
            .where(Attempt.status == AttemptStatus.running, col(Attempt.lease_expires_at) < now)
            .with_for_update(skip_locked=True)  # another service process may be reaping the same ones
        ).all()
        requeued = []
        for attempt in expired:
            job = session.get(Job, attempt.job_id, with_for_update=True)
            assert job is not None
            _end_attempt(session, job, attempt, lease_lost("lease"), now)
            if job.status == JobStatus.queued:
                requeued.append(job.id)
    for attempt_id in attempts_with_expired_nodes(db, now):
        job_id = _reap_nodes(db, attempt_id, now)
        if job_id is not None:
            requeued.append(job_id)
    return [j for j in requeued if j is not None]


def _reap_nodes(db: Database, attempt_id: int, now: float) -> int | None:
    """Mark the attempt's expired nodes lost (the heartbeat then stops the others); once every node has
    ended, the attempt ends as one. The job's id if it was queued again."""
    with db.write() as session:
        found = _locked(session, attempt_id)  # attempt, then job, then its nodes: the order of finish
        if found is None:
            return None
        attempt, job = found
        conn = session.connection()
        expire_nodes(conn, attempt_id, now, lease_lost("node's lease"))
        report = outcome(conn, attempt_id) if attempt.status == AttemptStatus.running else None
        if report is None:
            return None
        _end_attempt(session, job, attempt, report, now)
        return job.id if job.status == JobStatus.queued else None


def renew_all_leases(db: Database, lease_seconds: float) -> int:
    """At start-up: give every running attempt a full lease, so agents can reach a restarted service."""
    with db.write() as session:
        until = time.time() + lease_seconds
        result = session.execute(
            text("UPDATE attempts SET lease_expires_at = :until WHERE status = 'running' AND nnodes = 1"),
            {"until": until},
        )
        set_node_leases(session.connection(), until)
        return int(getattr(result, "rowcount", 0) or 0)
