"""Metric points in: idempotent ingestion of the agents' batches (the hottest path of the service).

Parsed with orjson and validated by hand (service/contracts.py has the limits and the published
schema), inserted as multi-row statements into a WITHOUT ROWID table keyed (attempt, key, step); each
batch also folds into metric_rollups (service/reports/metric_rollups.py). bench/README.md has the numbers.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import orjson

from service.contracts import (
    MAX_POINTS_PER_BATCH,
    METRIC_KEY,
    NON_FINITE_IN,
    STEP_LIMIT,
)
from service.core.db import Database
from service.reports.bad_report import BadReport
from service.reports.metric_rollups import fold_batch_rollups, recompute_rollups

_JOB_CACHE_SIZE = 100_000


_JOB_OF_ATTEMPT: weakref.WeakKeyDictionary[Database, dict[int, tuple[int, int | None]]] = (
    weakref.WeakKeyDictionary()
)


_CHUNK_ROWS = 250


_INSERT_POINTS = "INSERT OR IGNORE INTO metric_points (attempt_id, key, step, job_id, value, time) VALUES "


_INSERT_ONE = _INSERT_POINTS + "(?, ?, ?, ?, ?, ?)"


_INSERT_CHUNK = _INSERT_POINTS + ", ".join(["(?, ?, ?, ?, ?, ?)"] * _CHUNK_ROWS)


def _value(raw: Any, where: str) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise BadReport(f"{where}: must be a number, not a boolean")
    if isinstance(raw, (int, float)):
        value = float(raw)
    elif isinstance(raw, str) and raw in NON_FINITE_IN:
        value = NON_FINITE_IN[raw]
    else:
        raise BadReport(f"{where}: must be a number, null, 'NaN', 'Infinity' or '-Infinity'")
    return None if math.isnan(value) else value


@dataclass
class ParsedBatch:
    """A parsed batch, kept per metric: each key's steps, values and times in arrival order."""

    series: dict[str, tuple[list[int], list[float | None], list[float]]] = field(default_factory=dict)
    count: int = 0

    def rows(self, attempt_id: int, job_id: int) -> list[tuple[Any, ...]]:
        """metric_points rows, key by key: consecutive rows then land next to each other in the table."""
        return [
            (attempt_id, key, step, job_id, value, stamp)
            for key, (steps, values, stamps) in self.series.items()
            for step, value, stamp in zip(steps, values, stamps, strict=True)
        ]


def parse_metric_batch(body: bytes) -> ParsedBatch:
    """A `{"points": [{"step", "values", "time"}]}` body, validated value by value."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReport(f"body is not valid JSON: {exc}") from exc
    points = payload.get("points") if isinstance(payload, dict) else None
    if not isinstance(points, list):
        raise BadReport("points: required, a list of {step, values, time}")
    batch = ParsedBatch()
    series = batch.series
    now = time.time()
    for index, point in enumerate(points):
        if not isinstance(point, dict):
            raise BadReport(f"points[{index}]: must be an object")
        step = point.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < STEP_LIMIT:
            raise BadReport(f"points[{index}].step: must be an integer from 0")
        values = point.get("values")
        if not isinstance(values, dict):
            raise BadReport(f"points[{index}].values: must be an object of metric name -> number")
        stamp = point.get("time")
        if stamp is None:  # a line without a time: the arrival time is the best we know
            stamp = now
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            raise BadReport(f"points[{index}].time: must be a UNIX time in seconds")
        for key, raw in values.items():
            found = series.get(key)
            if found is None:
                if not METRIC_KEY.fullmatch(key):
                    raise BadReport(
                        f"points[{index}].values.{key[:64]}: metric names are letters, digits, _./-"
                    )
                found = series[key] = ([], [], [])
            # Plain floats are nearly every value: skip the general check (and its message) for them.
            if type(raw) is float:
                value: float | None = raw if raw == raw else None
            else:
                value = _value(raw, f"points[{index}].values.{key}")
            found[0].append(step)
            found[1].append(value)
            found[2].append(stamp)
        batch.count += len(values)
        if batch.count > MAX_POINTS_PER_BATCH:
            raise BadReport(f"points: at most {MAX_POINTS_PER_BATCH} values per batch; send smaller batches")
    return batch


def attempt_owner(db: Database, attempt_id: int) -> tuple[int, int | None] | None:
    """(job, worker) of an attempt (None: no such attempt); cached, since neither ever changes."""
    known = _JOB_OF_ATTEMPT.setdefault(db, {})
    owner = known.get(attempt_id)
    if owner is None:
        with db.raw_read() as conn:
            row = conn.execute(
                "SELECT job_id, worker_id FROM attempts WHERE id = ?", (attempt_id,)
            ).fetchone()
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
    db: Database, attempt_id: int, body: bytes, worker_id: int | None
) -> tuple[int, int] | None:
    """store_metrics for an attempt known only by id, from the worker that holds it (NotTheOwner
    otherwise); None when there is no such attempt."""
    owner = attempt_owner(db, attempt_id)
    if owner is None:
        return None
    job_id, holder = owner
    if holder is None or holder != worker_id:
        raise NotTheOwner(f"attempt {attempt_id} belongs to worker {holder}")
    return store_metrics(db, attempt_id, job_id, body)


def store_metrics(db: Database, attempt_id: int, job_id: int, body: bytes) -> tuple[int, int]:
    """Insert a batch; a point already stored for (attempt, key, step) is kept. Returns (accepted, dupes)."""
    batch = parse_metric_batch(body)
    if not batch.count:
        return 0, 0
    rows = batch.rows(attempt_id, job_id)
    last_step = max(max(steps) for steps, _, _ in batch.series.values())
    loss = batch.series.get("loss")
    last_loss = loss[1][loss[0].index(last_step)] if loss and last_step in loss[0] else None
    with db.raw_write() as conn:
        before = conn.total_changes
        _insert_points(conn, rows)
        accepted = conn.total_changes - before
        conn.executemany(
            "INSERT OR IGNORE INTO metric_keys (attempt_id, key) VALUES (?, ?)",
            [(attempt_id, k) for k in batch.series],
        )
        conn.execute(
            "UPDATE jobs SET last_step = ?, last_loss = coalesce(?, last_loss) "
            "WHERE id = ? AND (last_step IS NULL OR last_step <= ?)",
            (last_step, last_loss, job_id, last_step),
        )
        if accepted == len(rows):
            # Every point is new, so the batch's own summaries fold exactly into the stored ones.
            fold_batch_rollups(conn, batch, attempt_id)
        else:
            recompute_rollups(conn, attempt_id, batch)
    return accepted, len(rows) - accepted


def _insert_points(conn: Any, rows: list[tuple[Any, ...]]) -> None:
    # Multi-row VALUES statements bind a chunk at once: about 20% cheaper than executemany per row.
    whole = len(rows) - len(rows) % _CHUNK_ROWS
    for start in range(0, whole, _CHUNK_ROWS):
        conn.execute(_INSERT_CHUNK, list(chain.from_iterable(rows[start : start + _CHUNK_ROWS])))
    if whole < len(rows):
        conn.executemany(_INSERT_ONE, rows[whole:])
