"""Every status change of jobs, attempts and nodes goes through service/lifecycle.py: tried on a real
database (SQLite, then PostgreSQL), each change the kind's table forbids is refused and leaves the row
as it was, and an allowed change is written only where the row still holds the status it was decided
on."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from flightdeck.inventory import WorkerInventory
from flightdeck.service.core.db import Database
from flightdeck.service.core.tables import attempt_nodes, attempts, jobs
from flightdeck.service.jobs import submit_job
from flightdeck.service.lifecycle import StatusChanged, change_attempt_status, change_nodes, change_status
from flightdeck.service.registration import register_worker
from flightdeck.statuses import (
    ATTEMPT,
    JOB,
    NODE,
    AttemptStatus,
    IllegalTransition,
    JobStatus,
    Lifecycle,
    NodeStatus,
)
from tests.service.factories import cpu_inventory, recipe


def _pairs(lifecycle: Lifecycle[Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(allowed, forbidden) changes of the kind, every ordered pair of its statuses (a status to itself
    included: no table allows that)."""
    allowed, forbidden = [], []
    for old, new in itertools.product(list(lifecycle.status), repeat=2):
        (allowed if new in lifecycle.allowed.get(old, frozenset()) else forbidden).append(
            (old.value, new.value)
        )
    return allowed, forbidden


def test_the_tables_forbid_what_the_lifecycle_forbids() -> None:
    """The tables themselves: terminal statuses lead nowhere, and the counts are the ones documented."""
    for lifecycle in (JOB, ATTEMPT, NODE):
        for status in lifecycle.status:
            assert (status in lifecycle.allowed) == (
                not status.is_terminal() and status != NodeStatus.released
            )
    assert [len(_pairs(k)[0]) for k in (JOB, ATTEMPT, NODE)] == [11, 4, 13]


def _stored(db: Database, table: Any, row_id: int) -> str:
    with db.reading() as conn:
        return str(conn.execute(select(table.c.status).where(table.c.id == row_id)).scalar_one())


def _put(db: Database, table: Any, row_id: int, status: str) -> None:
    """Test set-up only: place the row in `status`, bypassing the lifecycle."""
    with db.writing() as conn:
        conn.execute(update(table).where(table.c.id == row_id).values(status=status))


def _rows(db: Database) -> tuple[int, int, int]:
    """A job, one attempt of it and one node row (with its registered worker): real rows to change."""
    job = submit_job(db, recipe())
    assert job.id is not None
    worker, _ = register_worker(
        db, "w-1", WorkerInventory.model_validate(cpu_inventory()), caller=None, lease_seconds=60
    )
    now = time.time()
    with db.writing() as conn:
        attempt = conn.execute(
            insert(attempts)
            .values(
                job_id=job.id,
                number=1,
                worker_id=worker.id,
                status="running",
                started_at=now,
                plan={},
                findings=[],
            )
            .returning(attempts.c.id)
        ).scalar_one()
        node = conn.execute(
            insert(attempt_nodes)
            .values(
                job_id=job.id,
                worker_id=worker.id,
                attempt_id=attempt,
                status="waiting",
                devices=[0],
                joined_at=now,
            )
            .returning(attempt_nodes.c.id)
        ).scalar_one()
    return job.id, attempt, node


def _change(db: Database, kind: str, row_id: int, old: str, new: str) -> None:
    """The kind's guarded write, as the service makes it; a node's change of no row is a refusal too."""
    with db.writing() as conn:
        if kind == "job":
            change_status(conn, row_id, old, JobStatus(new), time.time(), "tried by the test")
        elif kind == "attempt":
            change_attempt_status(conn, row_id, old, AttemptStatus(new))
        elif change_nodes(conn, attempt_nodes.c.id == row_id, [NodeStatus(old)], NodeStatus(new)) != 1:
            raise StatusChanged(f"node {row_id} is not {old}")


_KINDS = {"job": (JOB, jobs, 0), "attempt": (ATTEMPT, attempts, 1), "node": (NODE, attempt_nodes, 2)}


@pytest.mark.parametrize("kind", list(_KINDS))
def test_each_forbidden_change_is_refused_and_each_stale_one_is_not_written(
    database: Database, kind: str
) -> None:
    lifecycle, table, which = _KINDS[kind]
    row_id = _rows(database)[which]
    allowed, forbidden = _pairs(lifecycle)
    for old, new in forbidden:
        _put(database, table, row_id, old)
        with pytest.raises(IllegalTransition):
            _change(database, kind, row_id, old, new)
        assert _stored(database, table, row_id) == old, (kind, old, new)
    statuses = [s.value for s in lifecycle.status]
    for old, new in allowed:
        # The row holds another status than the one the change was decided on: nothing is written.
        for stored in (s for s in statuses if s != old):
            _put(database, table, row_id, stored)
            with pytest.raises(StatusChanged):
                _change(database, kind, row_id, old, new)
            assert _stored(database, table, row_id) == stored, (kind, stored, old, new)
        _put(database, table, row_id, old)
        _change(database, kind, row_id, old, new)
        assert _stored(database, table, row_id) == new, (kind, old, new)
