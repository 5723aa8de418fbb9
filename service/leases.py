"""Leases: timestamps renewed by heartbeats (an attempt's, or each node's of a multi-node attempt);
expired ones are found by a query, never by in-memory timers, and their attempts end as `lost`."""

from __future__ import annotations

import time
from typing import Any

from flightdeck.service.attempt_endings import end_with_report, locked
from flightdeck.service.contracts import FinishReport
from flightdeck.service.core.db import Database
from flightdeck.service.gangs.node_leases import (
    attempts_with_expired_nodes,
    expire_nodes,
    renew_node,
    set_node_leases,
)
from flightdeck.service.gangs.nodes import holds_node, nodes_of, outcome, stopping_reason
from flightdeck.service.models import Attempt, Job, Worker
from flightdeck.service.statuses import AttemptStatus, JobStatus
from sqlalchemy import text
from sqlmodel import col, select


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
            end_with_report(session, job, attempt, lease_lost("lease"), now)
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
        found = locked(session, attempt_id)  # attempt, then job, then its nodes: the order of finish
        if found is None:
            return None
        attempt, job = found
        conn = session.connection()
        expire_nodes(conn, attempt_id, now, lease_lost("node's lease"))
        report = outcome(conn, attempt_id) if attempt.status == AttemptStatus.running else None
        if report is None:
            return None
        end_with_report(session, job, attempt, report, now)
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
