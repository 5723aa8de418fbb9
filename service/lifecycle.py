"""Every status change of jobs, attempts and nodes: checked against the kind's table
(flightdeck/statuses.py), written by one guarded statement (`UPDATE ... WHERE status IN <the statuses the
change may start from>`), so a row another writer moved meanwhile is never overwritten.

Each change a user would want on the job's timeline records its event there too: every job change
(`kind: status`, as ever), an attempt's end (`kind: attempt`: how it ended and why, with its code), and
a node lost or a worker let go from a gang that did not fill (`kind: node`, naming the worker). A node's
other moves (filled, delivered, handed back, ended with its attempt) are told by those.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Connection, insert, select, update
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session

from flightdeck.service.core.sql import (
    execute_many_rows,
    many_rows_insert,
    many_rows_update,
    many_rows_update_order,
)
from flightdeck.service.core.tables import attempt_nodes
from flightdeck.service.core.tables import attempts as attempts_table
from flightdeck.service.core.tables import events as events_table
from flightdeck.service.core.tables import jobs as jobs_table
from flightdeck.service.core.tables import workers as workers_table
from flightdeck.service.models import Attempt, Job
from flightdeck.statuses import ATTEMPT, JOB, NODE, AttemptStatus, JobStatus, NodeStatus

# --- jobs ---------------------------------------------------------------------------------------


class StatusChanged(RuntimeError):
    """The job's stored status was not the one the change was decided on (another writer got there)."""


@dataclass(frozen=True)
class StatusChange:
    """One job's move from `old` to `new`, with the other columns the same change sets (`values`: the
    claim's attempt count, a failure's cause) and the message its event carries."""

    job_id: int
    old: str
    new: JobStatus
    message: str = ""
    attempt_id: int | None = None
    values: dict[str, Any] = field(default_factory=dict)


def change_statuses(conn: Connection, changes: Sequence[StatusChange], now: float) -> None:
    """The one way a job's status changes: checked against the lifecycle (a terminal status never
    changes again), written only if the row still holds `old`, and recorded as an event.

    The guard makes a lost race an error (StatusChanged, the transaction rolls back) instead of a
    silent overwrite: on PostgreSQL another service process may be changing the same job. Changes
    made together (a batch of claims) are written as one statement per set of columns and one for
    their events (`many_rows_update`, `many_rows_insert`): on PostgreSQL a batch of 50 is one
    statement each, not 50.
    """
    dialect = conn.dialect.name
    rows_by_columns: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    for change in changes:
        JOB.check(change.old, change.new)
        row = {"status": change.new.value, "updated_at": now, **change.values}
        if change.new.is_terminal():
            row["finished_at"] = now
        # The values it sets, then the row it must find (many_rows_update_order): its id, holding `old`.
        rows_by_columns.setdefault(tuple(row), []).append((*row.values(), change.job_id, change.old))
    for columns, rows in rows_by_columns.items():
        done = execute_many_rows(conn, _guarded_update(dialect, columns), _update_order(columns), rows)
        if done.rowcount != len(rows):
            jobs = sorted(row[-2] for row in rows)[:10]
            old, new = rows[0][-1], rows[0][0]
            raise StatusChanged(
                f"job {jobs[0]} is no longer {old}; its change to {new} was not made"
                if len(rows) == 1
                else f"{len(rows) - done.rowcount} of jobs {jobs} no longer held the status their change was "
                "decided on; none of the changes was made"
            )
    events = [
        (
            change.job_id,
            change.attempt_id,
            "status",
            "info",
            change.message or f"{change.old} -> {change.new.value}",
            "{}",
            now,
        )
        for change in changes
    ]
    execute_many_rows(conn, _status_event(dialect), _EVENT_COLUMNS, events)


def change_status(
    conn: Connection,
    job_id: int,
    old: str,
    new: JobStatus,
    now: float,
    message: str = "",
    *,
    attempt_id: int | None = None,
    values: dict[str, Any] | None = None,
) -> None:
    """change_statuses for one job."""
    change_statuses(conn, [StatusChange(job_id, old, new, message, attempt_id, values or {})], now)


def running(
    job_id: int, *, attempt_id: int, number: int, started_at: float, worker_name: str, message: str
) -> StatusChange:
    """queued -> running for a claimed attempt (one worker's or a gang's): the attempt becomes the
    job's current one and the job's progress starts afresh (the list must not show the last one's).
    `started_at`: when the job's first attempt started."""
    return StatusChange(
        job_id,
        JobStatus.queued.value,
        JobStatus.running,
        message,
        attempt_id,
        {
            "attempt_count": number,
            "current_attempt_id": attempt_id,
            "started_at": started_at,
            "worker_name": worker_name,
            "last_step": None,
            "last_loss": None,
        },
    )


def fail_unlaunchable(
    conn: Connection, job_id: int, *, code: str, message: str, fix: str, now: float
) -> None:
    """queued -> failed for a job a claim found it cannot launch (P004, N001): failing it keeps one
    unlaunchable job from blocking every later claim."""
    change_status(
        conn,
        job_id,
        JobStatus.queued.value,
        JobStatus.failed,
        now,
        message,
        values={
            "failure_class": "preflight",
            "failure_code": code,
            "failure_message": message,
            "failure_fix": fix,
        },
    )


# Built once per dialect and run on the driver (service/core/sql.py): the claim runs these per batch.
_EVENT_COLUMNS = ("job_id", "attempt_id", "kind", "severity", "message", "data", "time")


@functools.cache
def _status_event(dialect: str) -> Any:
    return many_rows_insert(dialect, events_table, _EVENT_COLUMNS)


@functools.lru_cache(maxsize=64)
def _guarded_update(dialect: str, columns: tuple[str, ...]) -> Any:
    """UPDATE jobs SET <columns> WHERE id = <the row's job> AND status = <its old status>, for many rows;
    built once per set of columns."""
    return many_rows_update(dialect, jobs_table, columns, _GUARD)


_GUARD = ("id", "status")


@functools.lru_cache(maxsize=64)
def _update_order(columns: tuple[str, ...]) -> tuple[str, ...]:
    return many_rows_update_order(columns, _GUARD)


def set_status(session: Session, job: Job, new: JobStatus, now: float, message: str = "") -> None:
    """change_status for a job loaded through the ORM; the loaded object then holds what was stored.

    The caller read `job` in this transaction with its row locked (`with_for_update`), so the status
    it decided on is the stored one on PostgreSQL too.
    """
    assert job.id is not None
    session.flush()  # this transaction's other changes (a new attempt's id) reach the database first
    change_status(
        session.connection(), job.id, job.status, new, now, message, attempt_id=job.current_attempt_id
    )
    set_committed_value(job, "status", new.value)
    set_committed_value(job, "updated_at", now)
    if new.is_terminal():
        set_committed_value(job, "finished_at", now)


# --- attempts -----------------------------------------------------------------------------------

# A claim (or a filled gang) writes its attempt in this status: creating a row is no transition.
NEW_ATTEMPT = AttemptStatus.running
# ...and the nodes a worker claims with it (a gang's members join as `waiting` instead).
NEW_NODE = NodeStatus.running


def end_attempt(session: Session, attempt: Attempt, new: AttemptStatus, values: dict[str, Any]) -> None:
    """running -> `new` for an attempt loaded through the ORM, with the other columns its end sets; the
    loaded object then holds what was stored. StatusChanged when the row no longer holds the status
    the caller read (another writer ended it first)."""
    assert attempt.id is not None
    session.flush()
    change_attempt_status(session.connection(), attempt.id, attempt.status, new, values)
    for name, value in {"status": new.value, **values}.items():
        set_committed_value(attempt, name, value)


def change_attempt_status(
    conn: Connection, attempt_id: int, old: str, new: AttemptStatus, values: dict[str, Any] | None = None
) -> None:
    """The attempt goes from `old` to `new` (IllegalTransition if its table forbids it), written only
    where the row still holds `old` (StatusChanged otherwise), and its end recorded as an event."""
    ATTEMPT.check(old, new)
    values = values or {}
    done = conn.execute(
        update(attempts_table)
        .where(
            attempts_table.c.id == attempt_id, attempts_table.c.status.in_(_allowed_from(ATTEMPT, [old], new))
        )
        .values(status=new.value, **values)
        .returning(attempts_table.c.job_id, attempts_table.c.number)
    ).all()
    if len(done) != 1:
        raise StatusChanged(
            f"attempt {attempt_id} is no longer {old}; its change to {new.value} was not made"
        )
    [(job_id, number)] = done
    cause = values.get("failure_class")
    code = values.get("failure_code")
    said = f"attempt {number} {new.value}"
    if cause and new != AttemptStatus.lost:
        said += f" ({cause}{' ' + code if code and code not in cause else ''})"
    if values.get("message") and new != AttemptStatus.succeeded:
        said += f": {values['message']}"
    conn.execute(
        insert(events_table).values(
            job_id=job_id,
            attempt_id=attempt_id,
            kind="attempt",
            # The code is in the message and data, not the event's code: that one names findings (health,
            # preflight), which readers filter on.
            code=None,
            severity=_ATTEMPT_SEVERITY[new],
            message=said,
            fix=values.get("fix") if new != AttemptStatus.succeeded else None,
            data={
                "status": new.value,
                "failure_class": cause,
                "failure_code": code,
                "exit_code": values.get("exit_code"),
            },
            time=values.get("finished_at") or time.time(),
        )
    )


_ATTEMPT_SEVERITY = {
    AttemptStatus.succeeded: "info",
    AttemptStatus.cancelled: "info",
    AttemptStatus.lost: "warn",
    AttemptStatus.failed: "error",
}


# --- nodes of an attempt ----------------------------------------------------------------------


def change_nodes(
    conn: Connection,
    where: ColumnElement[bool],
    old: Iterable[NodeStatus],
    new: NodeStatus,
    values: dict[str, Any] | None = None,
) -> int:
    """The node rows `where` selects that hold one of `old` become `new` (IllegalTransition if the
    table forbids any of those changes); rows in another status are left as they are. The number of
    rows changed. A node lost, or a worker let go from its gang, is recorded as an event."""
    sources = _allowed_from(NODE, list(old), new)
    values = values or {}
    c = attempt_nodes.c
    done = conn.execute(
        update(attempt_nodes)
        .where(where, c.status.in_(sources))
        .values(status=new.value, **values)
        .returning(c.job_id, c.attempt_id, c.node_rank, c.worker_id)
    ).all()
    if new in _NODE_EVENTS and done:
        names = dict(
            conn.execute(
                select(workers_table.c.id, workers_table.c.name).where(
                    workers_table.c.id.in_({row.worker_id for row in done})
                )
            ).all()
        )
        now = time.time()
        conn.execute(
            insert(events_table),
            [
                {
                    "job_id": row.job_id,
                    "attempt_id": row.attempt_id,
                    "kind": "node",
                    "code": _NODE_EVENTS[new].code,
                    "severity": _NODE_EVENTS[new].severity,
                    "message": _NODE_EVENTS[new].message(row.node_rank, names.get(row.worker_id), values),
                    "fix": _NODE_EVENTS[new].fix,
                    "data": {
                        "status": new.value,
                        "node_rank": row.node_rank,
                        "worker": names.get(row.worker_id),
                    },
                    "time": values.get("finished_at") or now,
                }
                for row in done
            ],
        )
    return len(done)


def _lost(rank: int | None, worker: str | None, values: dict[str, Any]) -> str:
    why = (values.get("report") or {}).get("message")
    return f"node {rank} ({worker}) lost" + (f": {why}" if why else "")


def _released(rank: int | None, worker: str | None, values: dict[str, Any]) -> str:
    return f"{worker} left the job's gang, which did not fill in time; it takes other jobs meanwhile"


# The node changes a user sees on the job's timeline.
class _NodeEvent(NamedTuple):
    severity: str
    code: str | None  # a catalog code (docs/failures.md)
    message: Callable[[int | None, str | None, dict[str, Any]], str]
    fix: str | None


_NODE_EVENTS: dict[NodeStatus, _NodeEvent] = {
    NodeStatus.lost: _NodeEvent("warn", None, _lost, None),
    NodeStatus.released: _NodeEvent(
        "info",
        "N002",
        _released,
        "the job stays queued in its order and starts once as many workers that fit it as it has nodes are "
        "free together: free or add workers; FLIGHTDECK_GANG_WAIT_SECONDS sets how long a member waits",
    ),
}


def _allowed_from(lifecycle: Any, old: list[Any], new: Any) -> list[str]:
    """`old`, each checked against the table: the WHERE status IN of a guarded change to `new`."""
    for status in old:
        lifecycle.check(status, new)
    return [lifecycle.status(s).value for s in old]
