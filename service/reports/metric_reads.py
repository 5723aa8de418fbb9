"""Metric points out: cursor pages by step, one series, and the downsampled view (peaks survive)."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from flightdeck.contracts import (
    DEFAULT_MAX_METRIC_KEYS,
    NAN,
    encode_number,
)
from flightdeck.service.core.db import Database
from flightdeck.service.core.sql import run_compiled
from flightdeck.service.core.tables import metric_keys, metric_points, metric_rollups
from flightdeck.service.reports.metric_rollups import ROLLUP_LEVELS, merge_up

_P = metric_points.c


def json_numbers(values: list[float | None]) -> list[float | str] | list[float]:
    """json_number over a list; a list with nothing to replace (the usual case) is returned as is."""
    if None in values or math.inf in values or -math.inf in values:
        return [encode_number(v) for v in values]
    return values  # type: ignore[return-value]


def attempt_keys(conn: Connection, attempt_id: int, limit: int = DEFAULT_MAX_METRIC_KEYS) -> list[str]:
    """The attempt's metric names in order, at most `limit`: a read costs a query per name, so it stays
    bounded even for an attempt that stored more names before the limit existed."""
    c = metric_keys.c
    query = select(c.key).where(c.attempt_id == attempt_id).order_by(c.key).limit(limit)
    return list(conn.execute(query).scalars())


def _series_page(attempt_id: int, key: str, after: int, limit: int) -> Any:
    return (
        select(_P.step, _P.value)
        .where(_P.attempt_id == attempt_id, _P.key == key, _P.step > after)
        .order_by(_P.step)
        .limit(limit)
    )


def read_steps(
    db: Database,
    attempt_id: int,
    after: int,
    limit: int,
    keys: list[str] | None,
    max_keys: int = DEFAULT_MAX_METRIC_KEYS,
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to `limit` steps after `after`, each with the values of at most `max_keys` metrics; and the
    cursor for the next page."""
    with db.snapshot() as conn:  # the keys and every series as of one commit
        wanted = (keys or attempt_keys(conn, attempt_id, max_keys))[:max_keys]
        by_step: dict[int, dict[str, Any]] = {}
        for key in wanted:
            # Each series' first `limit` steps contain every step of the merged page's first `limit`.
            for step, value in conn.execute(_series_page(attempt_id, key, after, limit)):
                by_step.setdefault(step, {})[key] = encode_number(value)
    steps = sorted(by_step)[:limit]
    points = [{"step": s, "values": by_step[s]} for s in steps]
    return points, (steps[-1] if len(steps) == limit else None)


def read_series(db: Database, attempt_id: int, key: str, after: int, limit: int) -> dict[str, Any]:
    with db.reading() as conn:
        rows = conn.execute(_series_page(attempt_id, key, after, limit)).all()
    steps, values = (list(column) for column in zip(*rows, strict=True)) if rows else ([], [])
    return {
        "key": key,
        "steps": steps,
        "values": json_numbers(values),
        "next_after": steps[-1] if len(steps) == limit else None,
    }


def read_downsampled(
    db: Database,
    attempt_id: int,
    keys: list[str] | None,
    buckets: int,
    max_keys: int = DEFAULT_MAX_METRIC_KEYS,
) -> dict[str, Any]:
    """Each series (at most `max_keys`) cut into at most `buckets` step ranges with min, max and last
    value: peaks survive.

    Long series are read from the coarsest rollup level finer than the bucket width asked for, so a
    million points cost a few thousand rows; short ones straight from the points.
    """
    with db.snapshot() as conn:  # the keys and every series as of one commit
        wanted = (keys or attempt_keys(conn, attempt_id, max_keys))[:max_keys]
        series: dict[str, Any] = {}
        spans: dict[str, tuple[int, int]] = {}
        at_level: dict[int, list[str]] = {}
        for key in wanted:
            # Two single-aggregate queries: each is one index probe, where min+max+count scans the series.
            of_series = (_P.attempt_id == attempt_id, _P.key == key)
            lo = conn.execute(select(func.min(_P.step)).where(*of_series)).scalar()
            if lo is None:
                continue
            hi = conn.execute(select(func.max(_P.step)).where(*of_series)).scalar_one()
            asked = math.ceil((hi - lo + 1) / buckets)
            level = max((lv for lv in ROLLUP_LEVELS if 1 << lv <= asked), default=None)
            if level is None:
                series[key] = _downsample_points(conn, attempt_id, key, lo, max(1, asked))
            else:
                spans[key] = (lo, hi)
                at_level.setdefault(level, []).append(key)
        for level, level_keys in at_level.items():
            # One query for every metric's rows, unless the names were cut at max_keys: then the level
            # may hold other names' rows too, and only those read are fetched.
            every = keys is None and len(wanted) < max_keys
            rows = _rollup_rows(conn, attempt_id, level, None if every else level_keys)
            for key in level_keys:
                series[key] = _downsample_rollups(rows.get(key, []), *spans[key], level, buckets)
    return {
        "attempt_id": attempt_id,
        "buckets": buckets,
        "series": {key: series[key] for key in wanted if key in series},
    }


_R = metric_rollups.c
_AT_LEVEL = (
    select(_R.key, _R.bucket, _R.lo, _R.hi, _R.n, _R.last_step, _R.last_value)
    .where(_R.attempt_id == bindparam("attempt"), _R.level == bindparam("level"))
    .order_by(_R.bucket)
)
_AT_LEVEL_OF_KEY = _AT_LEVEL.where(_R.key == bindparam("key"))


def _rollup_rows(
    conn: Connection, attempt_id: int, level: int, keys: list[str] | None
) -> dict[str, list[tuple[Any, ...]]]:
    """The summaries at `level` (key, bucket, lo, hi, n, last step, last value) of `keys` (None: of
    every metric), each metric's by bucket.

    The table is keyed by level and bucket before the metric (models.MetricRollup), so a level's rows
    of every metric are one range: the view of every metric reads it in one query, and one metric
    steps over the others' rows in it. Run on the driver's cursor (run_compiled): tens of thousands of
    rows as SQLAlchemy rows cost about a fifth more.
    """
    params = {"attempt": attempt_id, "level": level}
    if keys is not None:
        return {key: run_compiled(conn, _AT_LEVEL_OF_KEY, {**params, "key": key}).rows for key in keys}
    found: dict[str, list[tuple[Any, ...]]] = {}
    for row in run_compiled(conn, _AT_LEVEL, params).rows:
        found.setdefault(row[0], []).append(row)
    return found


def _downsample_points(conn: Connection, attempt_id: int, key: str, lo: int, width: int) -> dict[str, Any]:
    # Integer division on both databases: both operands are integers. count(value) skips NULLs (NaN).
    bucket = ((_P.step - lo) // width).label("b")
    rows = conn.execute(
        select(
            bucket,
            func.max(_P.step),
            func.min(_P.value),
            func.max(_P.value),
            func.count(),
            func.count(_P.value),
        )
        .where(_P.attempt_id == attempt_id, _P.key == key)
        .group_by(bucket)
        .order_by(bucket)
    ).all()
    last_steps = [r[1] for r in rows]
    last_values = dict(
        conn.execute(
            select(_P.step, _P.value).where(
                _P.attempt_id == attempt_id, _P.key == key, _P.step.in_(last_steps)
            )
        ).all()
    )
    return {
        "points": sum(r[4] for r in rows),
        "bucket_width": width,
        "steps": last_steps,
        "min": [encode_number(r[2]) if r[5] else NAN for r in rows],
        "max": [encode_number(r[3]) if r[5] else NAN for r in rows],
        "last": [encode_number(last_values.get(s)) for s in last_steps],
    }


def _downsample_rollups(
    rows: list[tuple[Any, ...]], lo: int, hi: int, level: int, buckets: int
) -> dict[str, Any]:
    """One series' view from its summaries at `level`, as `_rollup_rows` reads them."""
    # Buckets are whole runs of rollup buckets, so their width is a multiple of 2**level.
    first = lo >> level
    per = math.ceil(((hi >> level) - first + 1) / buckets)
    merged = merge_up([[(r[1] - first) // per, *r[2:]] for r in rows], 0)
    return {
        "points": sum(m[3] for m in merged),
        "bucket_width": per << level,
        "steps": [m[4] for m in merged],
        "min": json_numbers([m[1] for m in merged]),
        "max": json_numbers([m[2] for m in merged]),
        "last": json_numbers([m[5] for m in merged]),
    }
