"""metric_rollups: min, max, count and last value per 2**level steps, kept up to date by each batch,
so the downsampled view of a long run reads thousands of summaries instead of millions of points."""

from __future__ import annotations

import bisect
import operator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the batch's module imports this one to fold its batches in
    from service.reports.metric_ingest import ParsedBatch


# Rollup levels: bucket widths of 2**level steps (16 ... 65,536); each level is 4 times coarser.
ROLLUP_LEVELS = (4, 6, 8, 10, 12, 14, 16)


_ROLLUP_COLUMNS = (
    "INSERT INTO metric_rollups (attempt_id, key, level, bucket, lo, hi, n, last_step, last_value) "
)


# Folds a summary of new points into the stored one (NULL lo/hi: no finite value yet).
_MERGE_ROLLUP = (
    _ROLLUP_COLUMNS + "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
    "lo = CASE WHEN lo IS NULL OR excluded.lo < lo THEN excluded.lo ELSE lo END, "
    "hi = CASE WHEN hi IS NULL OR excluded.hi > hi THEN excluded.hi ELSE hi END, "
    "n = n + excluded.n, "
    "last_value = CASE WHEN excluded.last_step > last_step THEN excluded.last_value ELSE last_value END, "
    "last_step = max(last_step, excluded.last_step)"
)


_REPLACE_ROLLUP = (
    " WHERE true ON CONFLICT DO UPDATE SET lo = excluded.lo, hi = excluded.hi, n = excluded.n, "
    "last_step = excluded.last_step, last_value = excluded.last_value"
)


_ROLLUP_FROM_POINTS = (
    _ROLLUP_COLUMNS + "SELECT ?, ?, ?, g.b, g.lo, g.hi, g.n, g.ls, "
    "(SELECT p.value FROM metric_points p WHERE p.attempt_id = ? AND p.key = ? AND p.step = g.ls) "
    "FROM (SELECT step >> ? AS b, min(value) AS lo, max(value) AS hi, count(*) AS n, max(step) AS ls "
    "FROM metric_points WHERE attempt_id = ? AND key = ? AND step >= ? AND step < ? GROUP BY b) AS g"
    + _REPLACE_ROLLUP
)


_ROLLUP_FROM_BELOW = (
    _ROLLUP_COLUMNS + "SELECT ?, ?, ?, g.b, g.lo, g.hi, g.n, g.ls, "
    "(SELECT r.last_value FROM metric_rollups r WHERE r.attempt_id = ? AND r.key = ? AND r.level = ? "
    "AND r.bucket = g.lb) "
    "FROM (SELECT bucket >> ? AS b, min(lo) AS lo, max(hi) AS hi, sum(n) AS n, max(last_step) AS ls, "
    "max(bucket) AS lb FROM metric_rollups WHERE attempt_id = ? AND key = ? AND level = ? "
    "AND bucket >= ? AND bucket < ? GROUP BY b) AS g" + _REPLACE_ROLLUP
)


def batch_rollups(batch: ParsedBatch, attempt_id: int) -> list[tuple[Any, ...]]:
    """metric_rollups rows summarising only this batch's points, at every level."""
    out: list[tuple[Any, ...]] = []
    for key, (steps, values, _) in batch.series.items():
        if any(map(operator.ge, steps, steps[1:])):  # rarely: steps sent out of order
            order = sorted(range(len(steps)), key=steps.__getitem__)
            steps, values = [steps[i] for i in order], [values[i] for i in order]
        summaries = _summarise(steps, values, ROLLUP_LEVELS[0])
        below = ROLLUP_LEVELS[0]
        out.extend((attempt_id, key, below, *s) for s in summaries)
        for level in ROLLUP_LEVELS[1:]:
            summaries = merge_up(summaries, level - below)
            out.extend((attempt_id, key, level, *s) for s in summaries)
            below = level
    return out


def _summarise(steps: list[int], values: list[float | None], shift: int) -> list[list[Any]]:
    """[bucket, min, max, count, last step, last value] per 2**shift steps, from ascending steps."""
    out: list[list[Any]] = []
    start, end = 0, len(steps)
    while start < end:
        bucket = steps[start] >> shift
        stop = bisect.bisect_left(steps, (bucket + 1) << shift, start)
        chunk = values[start:stop]
        known = [v for v in chunk if v is not None] if None in chunk else chunk
        low, high = (min(known), max(known)) if known else (None, None)  # type: ignore[type-var]
        out.append([bucket, low, high, stop - start, steps[stop - 1], chunk[-1]])
        start = stop
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


def recompute_rollups(conn: Any, attempt_id: int, batch: ParsedBatch) -> None:
    """Rebuild the rollup buckets a batch touched from the stored points (some of its points were not new)."""
    base = ROLLUP_LEVELS[0]
    for key, (steps, _, _) in batch.series.items():
        first, last = min(steps), max(steps)
        span = ((first >> base) << base, ((last >> base) + 1) << base)
        conn.execute(
            _ROLLUP_FROM_POINTS, (attempt_id, key, base, attempt_id, key, base, attempt_id, key, *span)
        )
        below = base
        for level in ROLLUP_LEVELS[1:]:
            shift = level - below
            span = ((first >> level) << shift, ((last >> level) + 1) << shift)
            conn.execute(
                _ROLLUP_FROM_BELOW,
                (attempt_id, key, level, attempt_id, key, below, shift, attempt_id, key, below, *span),
            )
            below = level


def fold_batch_rollups(conn: Any, batch: ParsedBatch, attempt_id: int) -> None:
    """Fold a batch whose points are all new into the stored summaries (exact: nothing is counted twice)."""
    conn.executemany(_MERGE_ROLLUP, batch_rollups(batch, attempt_id))
