"""Leases: each node of an attempt holds one (every attempt has node rows: one worker's is node 0),
renewed by its worker's heartbeats; expired ones are found by a query, never by in-memory timers, and
their nodes end as `lost`, which ends the attempt once every node has ended."""

from __future__ import annotations

import time
from typing import Any

from sqlmodel import col, select

from flightdeck.contracts import FinishReport
from flightdeck.service.attempt_endings import end_with_report, locked
from flightdeck.service.core.db import Database
from flightdeck.service.gangs.node_leases import (
    attempts_with_expired_nodes,
    expire_nodes,
    renew_node,
    set_node_leases,
)
from flightdeck.service.gangs.nodes import holds_node, nodes_of, outcome, stopping_reason
from flightdeck.service.models import Attempt, Job, Worker
from flightdeck.statuses import AttemptStatus, JobStatus


def heartbeat(db: Database, worker_id: int, attempt_ids: list[int], lease_seconds: float) -> list[int] | None:
    """Extend the leases of the worker's nodes of its running attempts; return the attempts it must
    stop (None: no worker)."""
    now = time.time()
    with db.write() as session:
        worker = session.get(Worker, worker_id)
        if worker is None:
            return None
        worker.last_seen_at = now
        session.add(worker)
        if not attempt_ids:
            return []
        rows = session.exec(select(Attempt, Job).join(Job).where(col(Attempt.id).in_(attempt_ids))).all()
        conn = session.connection()
        known = {attempt.id for attempt, _ in rows}
        cancel = {a for a in attempt_ids if a not in known}
        for attempt, job in rows:
            if _beat(conn, attempt, job, worker_id, now + lease_seconds):
                cancel.add(attempt.id)  # type: ignore[arg-type]
        return sorted(cancel)


def _beat(conn: Any, attempt: Attempt, job: Job, worker_id: int, until: float) -> bool:
    """Renew this worker's node(s) of the attempt; True when they must stop: the worker holds none, the
    attempt ended, the job is being cancelled, the service stopped it, or another node ended without
    success (its ranks are gone, so these would wait in a collective)."""
    assert attempt.id is not None
    # Nothing renewed: the worker holds no node (stop), or only ended ones (decided below, as for any).
    if (
        renew_node(conn, attempt.id, worker_id, until) == 0
        and holds_node(conn, attempt.id, worker_id) is None
    ):
        return True
    return (
        attempt.status != AttemptStatus.running
        or job.status == JobStatus.cancelling
        or attempt.stop_code is not None
        or stopping_reason(nodes_of(conn, attempt.id)) is not None
    )


def lease_lost() -> FinishReport:
    """The report of a node whose worker stopped sending heartbeats."""
    return FinishReport(
        status="failed",
        failure_class="lease_lost",
        message="no heartbeat from the worker before the lease expired",
        fix="check the worker host; the job is retried while attempts remain",
    )


def reap_expired_leases(db: Database, now: float | None = None) -> list[int]:
    """Nodes whose lease ran out are lost; once all of an attempt's nodes have ended, the attempt ends
    as one and its job is requeued, cancelled or failed lease_lost. The ids of the jobs queued again."""
    now = now or time.time()
    requeued = [_reap(db, attempt_id, now) for attempt_id in attempts_with_expired_nodes(db, now)]
    return [j for j in requeued if j is not None]


def _reap(db: Database, attempt_id: int, now: float) -> int | None:
    """Mark the attempt's expired nodes lost (the heartbeat then stops the others); once every node has
    ended, the attempt ends as one. The job's id if it was queued again."""
    with locked(db, attempt_id) as found:  # attempt, then job, then its nodes: the order of finish
        if found is None:
            return None
        session, attempt, job = found
        conn = session.connection()
        expire_nodes(conn, attempt_id, now, lease_lost())
        report = outcome(conn, attempt_id) if attempt.status == AttemptStatus.running else None
        if report is None:
            return None
        end_with_report(session, job, attempt, report, now)
        return job.id if job.status == JobStatus.queued else None


def renew_all_leases(db: Database, lease_seconds: float) -> None:
    """At start-up: give every running node a full lease, so agents can reach a restarted service."""
    with db.writing() as conn:
        set_node_leases(conn, time.time() + lease_seconds)
