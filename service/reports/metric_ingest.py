"""Metric points in: idempotent ingestion of the agents' batches (the hottest path of the service).

Parsed with orjson and validated by hand (flightdeck/contracts.py has the limits and the published
schema), inserted as multi-row statements into a WITHOUT ROWID table keyed (attempt, key, step); each
batch also folds into metric_rollups (service/reports/metric_rollups.py). bench/README.md has the numbers.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from sqlalchemy import Connection, Float, Table, bindparam, func, or_, select, update

from flightdeck.contracts import (
    DEFAULT_MAX_METRIC_KEYS,
)
from flightdeck.service.core.db import Database
from flightdeck.service.core.sql import copy_new_rows, execute_many_rows, many_rows_insert, run_compiled
from flightdeck.service.core.tables import attempts, jobs, metric_keys, metric_points
from flightdeck.service.reports.bad_report import BadReport
from flightdeck.service.reports.metric_batch import ParsedBatch, parse_metric_batch
from flightdeck.service.reports.metric_rollups import fold_batch_rollups, recompute_rollups

_JOB_CACHE_SIZE = 100_000


_JOB_OF_ATTEMPT: weakref.WeakKeyDictionary[Database, dict[int, tuple[int, int | None]]] = (
    weakref.WeakKeyDictionary()
)


def attempt_owner(db: Database, attempt_id: int) -> tuple[int, int | None] | None:
    """(job, worker) of an attempt (None: no such attempt); cached, since neither ever changes."""
    known = _JOB_OF_ATTEMPT.setdefault(db, {})
    owner = known.get(attempt_id)
    if owner is None:
        with db.reading() as conn:
            row = conn.execute(
                select(attempts.c.job_id, attempts.c.worker_id).where(attempts.c.id == attempt_id)
            ).first()
        if row is None:
            return None
        if len(known) >= _JOB_CACHE_SIZE:
            known.clear()
        owner = known[attempt_id] = (int(row[0]), row[1])
    return owner


def forget_attempt(db: Database, attempt_id: int) -> None:
    """A handed-back attempt's row is gone and its id may be issued again: drop what was cached."""
    _JOB_OF_ATTEMPT.setdefault(db, {}).pop(attempt_id, None)


class NotTheOwner(PermissionError):
    """The attempt was claimed by another worker."""


def ingest_metrics(
    db: Database,
    attempt_id: int,
    body: bytes,
    worker_id: int | None,
    max_keys: int = DEFAULT_MAX_METRIC_KEYS,
) -> tuple[int, int] | None:
    """store_metrics for an attempt known only by id, from the worker that holds it (NotTheOwner
    otherwise); None when there is no such attempt."""
    owner = attempt_owner(db, attempt_id)
    if owner is None:
        return None
    job_id, holder = owner
    if holder is None or holder != worker_id:
        raise NotTheOwner(f"attempt {attempt_id} belongs to worker {holder}")
    return store_metrics(db, attempt_id, job_id, body, max_keys)


def _too_many_keys(limit: int, crossing: str) -> BadReport:
    return BadReport(
        f"values.{crossing[:64]}: an attempt reports at most {limit} distinct metric names "
        "(FLIGHTDECK_MAX_METRIC_KEYS) and this one would cross it; report fewer names (a name per "
        "quantity, not per item)"
    )


def _key_that_crossed(db: Database, attempt_id: int, batch: ParsedBatch, limit: int) -> str:
    """The first of the batch's new names beyond the limit, read against what is committed (the
    batch's own insert is about to be rolled back). Only on the refusal path."""
    with db.reading() as conn:
        known = set(
            conn.execute(select(metric_keys.c.key).where(metric_keys.c.attempt_id == attempt_id)).scalars()
        )
    new = [key for key in batch.series if key not in known]
    return new[max(0, min(len(new) - 1, limit - len(known)))] if new else next(iter(batch.series))


def store_metrics(
    db: Database, attempt_id: int, job_id: int, body: bytes, max_keys: int = DEFAULT_MAX_METRIC_KEYS
) -> tuple[int, int]:
    """Insert a batch; a point already stored for (attempt, key, step) is kept. Returns (accepted, dupes).

    A batch that would give the attempt more than `max_keys` metric names is refused whole (BadReport).
    """
    batch = parse_metric_batch(body)
    if not batch.count:
        return 0, 0
    if len(batch.series) > max_keys:
        raise _too_many_keys(max_keys, list(batch.series)[max_keys])
    rows = batch.rows(attempt_id, job_id)
    last_step = max(max(steps) for steps, _, _ in batch.series.values())
    loss = batch.series.get("loss")
    last_loss = loss[1][loss[0].index(last_step)] if loss and last_step in loss[0] else None
    with db.writing() as conn:
        accepted = _insert_points(conn, db.dialect, rows)
        key_columns = ("attempt_id", "key")
        new_keys = execute_many_rows(
            conn,
            _new_rows_only(db.dialect, metric_keys, key_columns),
            key_columns,
            [(attempt_id, k) for k in batch.series],
        ).rowcount
        # Counted only when the batch brought a new name: the usual batch repeats known ones.
        if new_keys and run_compiled(conn, _KEY_COUNT, {"attempt": attempt_id}).rows[0][0] > max_keys:
            raise _too_many_keys(max_keys, _key_that_crossed(db, attempt_id, batch, max_keys))
        run_compiled(conn, _PROGRESS, {"job": job_id, "step": last_step, "loss": last_loss})
        if accepted == len(rows):
            # Every point is new, so the batch's own summaries fold exactly into the stored ones.
            fold_batch_rollups(conn, db.dialect, batch, attempt_id)
        else:
            recompute_rollups(conn, db.dialect, attempt_id, batch)
    return accepted, len(rows) - accepted


POINT_COLUMNS = ("attempt_id", "key", "step", "job_id", "value", "time")
_KEY_COUNT = (
    select(func.count()).select_from(metric_keys).where(metric_keys.c.attempt_id == bindparam("attempt"))
)

# The job's progress for the list view: the last step and its loss, never moving backwards. Built
# once and run on the driver's cursor (run_compiled): through Connection.execute it cost 4-5% of a
# batch (bench/README.md).
_PROGRESS = (
    update(jobs)
    .where(
        jobs.c.id == bindparam("job"),
        or_(jobs.c.last_step.is_(None), jobs.c.last_step <= bindparam("step")),
    )
    .values(
        last_step=bindparam("step"),
        last_loss=func.coalesce(bindparam("loss", type_=Float), jobs.c.last_loss),
    )
)


@functools.cache
def _new_rows_only(dialect: str, table: Table, columns: tuple[str, ...]) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING: a row already stored under its key is kept as it was."""
    return many_rows_insert(dialect, table, columns).on_conflict_do_nothing()


def _insert_points(conn: Connection, dialect: str, rows: list[tuple[Any, ...]]) -> int:
    """Insert what is new; returns how many rows were."""
    if dialect == "postgresql" and copy_new_rows(conn, metric_points, POINT_COLUMNS, rows):
        return len(rows)  # all new: COPY took them at once
    stmt = _new_rows_only(dialect, metric_points, POINT_COLUMNS)
    return execute_many_rows(conn, stmt, POINT_COLUMNS, rows).rowcount
