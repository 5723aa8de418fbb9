"""metric_rollups: min, max, count and last value per 2**level steps, kept up to date by each batch,
so the downsampled view of a long run reads thousands of summaries instead of millions of points."""

from __future__ import annotations

import bisect
import functools
import operator
from typing import Any

from sqlalchemy import Connection, Integer, Select, case, func, literal, or_, select, true

from flightdeck.service.core.sql import execute_many_rows, greatest, many_rows_insert, upsert
from flightdeck.service.core.tables import metric_points, metric_rollups
from flightdeck.service.reports.metric_batch import ParsedBatch

# Rollup levels: bucket widths of 2**level steps (16 ... 65,536); each level is 4 times coarser.
ROLLUP_LEVELS = (4, 6, 8, 10, 12, 14, 16)


_KEY = ("attempt_id", "key", "level", "bucket")
_SUMMARY = ("lo", "hi", "n", "last_step", "last_value")


@functools.cache  # one statement per dialect: building it cost more than running it for a small batch
def _merge_rollup(dialect: str) -> Any:
    """Folds a summary of new points into the stored one (NULL lo/hi: no finite value yet)."""
    stmt = many_rows_insert(dialect, metric_rollups, (*_KEY, *_SUMMARY))
    new, old = stmt.excluded, metric_rollups.c
    return stmt.on_conflict_do_update(
        index_elements=list(_KEY),
        set_={
            "lo": case((or_(old.lo.is_(None), new.lo < old.lo), new.lo), else_=old.lo),
            "hi": case((or_(old.hi.is_(None), new.hi > old.hi), new.hi), else_=old.hi),
            "n": old.n + new.n,
            # Every SET expression reads the row as it was: last_step here is still the stored one.
            "last_value": case((new.last_step > old.last_step, new.last_value), else_=old.last_value),
            "last_step": greatest(old.last_step, new.last_step),
        },
    )


def _replace_rollups(dialect: str, source: Select[Any]) -> Any:
    """INSERT the summaries `source` selects, replacing the stored ones of the same buckets."""
    stmt = upsert(dialect, metric_rollups).from_select([*_KEY, *_SUMMARY], source)
    return stmt.on_conflict_do_update(index_elements=list(_KEY), set_={c: stmt.excluded[c] for c in _SUMMARY})


def _rollups_from_points(dialect: str, attempt_id: int, key: str, level: int, span: tuple[int, int]) -> Any:
    p = metric_points.c
    bucket = p.step.op(">>")(literal(level, Integer))  # PostgreSQL shifts by an int4 only
    g = (
        select(
            bucket.label("b"),
            func.min(p.value).label("lo"),
            func.max(p.value).label("hi"),
            func.count().label("n"),
            func.max(p.step).label("ls"),
        )
        .where(p.attempt_id == attempt_id, p.key == key, p.step >= span[0], p.step < span[1])
        .group_by(bucket)
        .subquery("g")
    )
    last = metric_points.alias("p")
    last_value = (
        select(last.c.value)
        .where(last.c.attempt_id == attempt_id, last.c.key == key, last.c.step == g.c.ls)
        .scalar_subquery()
    )
    # `WHERE true`: SQLite cannot otherwise tell an INSERT ... SELECT's ON CONFLICT from a join's ON.
    source = select(
        literal(attempt_id), literal(key), literal(level), g.c.b, g.c.lo, g.c.hi, g.c.n, g.c.ls, last_value
    ).where(true())
    return _replace_rollups(dialect, source)


def _rollups_from_below(
    dialect: str, attempt_id: int, key: str, level: int, below: int, span: tuple[int, int]
) -> Any:
    r = metric_rollups.c
    bucket = r.bucket.op(">>")(literal(level - below, Integer))
    g = (
        select(
            bucket.label("b"),
            func.min(r.lo).label("lo"),
            func.max(r.hi).label("hi"),
            func.sum(r.n).label("n"),
            func.max(r.last_step).label("ls"),
            func.max(r.bucket).label("lb"),
        )
        .where(
            r.attempt_id == attempt_id,
            r.key == key,
            r.level == below,
            r.bucket >= span[0],
            r.bucket < span[1],
        )
        .group_by(bucket)
        .subquery("g")
    )
    last = metric_rollups.alias("r")
    last_value = (
        select(last.c.last_value)
        .where(
            last.c.attempt_id == attempt_id, last.c.key == key, last.c.level == below, last.c.bucket == g.c.lb
        )
        .scalar_subquery()
    )
    source = select(
        literal(attempt_id), literal(key), literal(level), g.c.b, g.c.lo, g.c.hi, g.c.n, g.c.ls, last_value
    ).where(true())
    return _replace_rollups(dialect, source)


def batch_rollups(batch: ParsedBatch, attempt_id: int) -> list[tuple[Any, ...]]:
    """metric_rollups rows (_KEY + _SUMMARY) summarising only this batch's points, at every level."""
    out: list[tuple[Any, ...]] = []
    # Metrics reported at the same steps share one list of them (ParsedBatch): their order and buckets
    # are worked out once (177 -> 141 us for a batch of 10 metrics).
    layouts: dict[int, _Layout] = {}
    for key, (steps, values, _) in batch.series.items():
        layout = layouts.get(id(steps))
        if layout is None:
            layout = layouts[id(steps)] = _layout(steps, ROLLUP_LEVELS[0])
        order, chunks = layout
        if order is not None:
            values = [values[i] for i in order]
        summaries = _summarise(values, chunks)
        below = ROLLUP_LEVELS[0]
        out.extend((attempt_id, key, below, *s) for s in summaries)
        for level in ROLLUP_LEVELS[1:]:
            summaries = merge_up(summaries, level - below)
            out.extend((attempt_id, key, level, *s) for s in summaries)
            below = level
    return out


# The order that sorts a batch's steps (None: they came in order), and per bucket of 2**shift steps
# its number, first and end positions in that order, and last step.
_Layout = tuple[list[int] | None, list[tuple[int, int, int, int]]]


def _layout(steps: list[int], shift: int) -> _Layout:
    order = None
    if any(map(operator.ge, steps, steps[1:])):  # rarely: steps sent out of order
        order = sorted(range(len(steps)), key=steps.__getitem__)
        steps = [steps[i] for i in order]
    chunks = []
    start, end = 0, len(steps)
    while start < end:
        bucket = steps[start] >> shift
        stop = bisect.bisect_left(steps, (bucket + 1) << shift, start)
        chunks.append((bucket, start, stop, steps[stop - 1]))
        start = stop
    return order, chunks


def _summarise(values: list[float | None], chunks: list[tuple[int, int, int, int]]) -> list[list[Any]]:
    """[bucket, min, max, count, last step, last value] per bucket of a `_layout`, from values in its order."""
    out: list[list[Any]] = []
    for bucket, start, stop, last_step in chunks:
        chunk = values[start:stop]
        known = [v for v in chunk if v is not None] if None in chunk else chunk
        low, high = (min(known), max(known)) if known else (None, None)  # type: ignore[type-var]
        out.append([bucket, low, high, stop - start, last_step, chunk[-1]])
    return out


def merge_up(rows: list[list[Any]], shift: int) -> list[list[Any]]:
    """Summaries of ascending buckets merged into buckets 2**shift times wider (NULL: no finite value)."""
    merged: list[list[Any]] = []
    for bucket, low, high, count, last_step, last_value in rows:
        up = bucket >> shift
        if merged and merged[-1][0] == up:
            m = merged[-1]
            if low is not None and (m[1] is None or low < m[1]):
                m[1] = low
            if high is not None and (m[2] is None or high > m[2]):
                m[2] = high
            m[3] += count
            m[4], m[5] = last_step, last_value  # ascending, so the later row ends later
        else:
            merged.append([up, low, high, count, last_step, last_value])
    return merged


def recompute_rollups(conn: Connection, dialect: str, attempt_id: int, batch: ParsedBatch) -> None:
    """Rebuild the rollup buckets a batch touched from the stored points (some of its points were not new)."""
    base = ROLLUP_LEVELS[0]
    for key, (steps, _, _) in batch.series.items():
        first, last = min(steps), max(steps)
        span = ((first >> base) << base, ((last >> base) + 1) << base)
        conn.execute(_rollups_from_points(dialect, attempt_id, key, base, span))
        below = base
        for level in ROLLUP_LEVELS[1:]:
            shift = level - below
            span = ((first >> level) << shift, ((last >> level) + 1) << shift)
            conn.execute(_rollups_from_below(dialect, attempt_id, key, level, below, span))
            below = level


def fold_batch_rollups(conn: Connection, dialect: str, batch: ParsedBatch, attempt_id: int) -> None:
    """Fold a batch whose points are all new into the stored summaries (exact: nothing is counted twice)."""
    execute_many_rows(conn, _merge_rollup(dialect), (*_KEY, *_SUMMARY), batch_rollups(batch, attempt_id))
