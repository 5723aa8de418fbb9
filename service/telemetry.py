"""Metric points, log chunks and events: idempotent ingestion and cursor reads.

The ingestion path is hot (every rank's steps), so it parses with orjson, validates by hand and
inserts multi-row statements into a WITHOUT ROWID table keyed (attempt, key, step). Each batch also
updates metric_rollups (min, max, count, last value per 2**level steps), so the downsampled view of a
long run reads thousands of summaries instead of millions of points. bench/README.md has the numbers.
"""

from __future__ import annotations

import bisect
import math
import operator
import time
import weakref
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import orjson

from service.contracts import (
    MAX_LOG_CHUNK_BYTES,
    MAX_POINTS_PER_BATCH,
    METRIC_KEY,
    NAN,
    NON_FINITE_IN,
    STEP_LIMIT,
    encode_number,
)
from service.core.db import Database

# Rollup levels: bucket widths of 2**level steps (16 ... 65,536); each level is 4 times coarser.
ROLLUP_LEVELS = (4, 6, 8, 10, 12, 14, 16)
_JOB_CACHE_SIZE = 100_000
_JOB_OF_ATTEMPT: weakref.WeakKeyDictionary[Database, dict[int, int]] = weakref.WeakKeyDictionary()
_CHUNK_ROWS = 250
_INSERT_POINTS = "INSERT OR IGNORE INTO metric_points (attempt_id, key, step, job_id, value, time) VALUES "
_INSERT_ONE = _INSERT_POINTS + "(?, ?, ?, ?, ?, ?)"
_INSERT_CHUNK = _INSERT_POINTS + ", ".join(["(?, ?, ?, ?, ?, ?)"] * _CHUNK_ROWS)
_FIRST_STEP = "SELECT min(step) FROM metric_points WHERE attempt_id = ? AND key = ?"
_LAST_STEP = "SELECT max(step) FROM metric_points WHERE attempt_id = ? AND key = ?"
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


class BadReport(ValueError):
    """A report body that cannot be stored; the message names the field and the fix."""


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
                if not METRIC_KEY.match(key):
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


def attempt_job_id(db: Database, attempt_id: int) -> int | None:
    """The job an attempt belongs to (None: no such attempt); cached, since it never changes."""
    known = _JOB_OF_ATTEMPT.setdefault(db, {})
    job_id = known.get(attempt_id)
    if job_id is None:
        with db.raw_read() as conn:
            row = conn.execute("SELECT job_id FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        if row is None:
            return None
        if len(known) >= _JOB_CACHE_SIZE:
            known.clear()
        job_id = known[attempt_id] = int(row[0])
    return job_id


def ingest_metrics(db: Database, attempt_id: int, body: bytes) -> tuple[int, int] | None:
    """store_metrics for an attempt known only by id; None when there is no such attempt."""
    job_id = attempt_job_id(db, attempt_id)
    if job_id is None:
        return None
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
            conn.executemany(_MERGE_ROLLUP, batch_rollups(batch, attempt_id))
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


def json_numbers(values: list[float | None]) -> list[float | str] | list[float]:
    """json_number over a list; a list with nothing to replace (the usual case) is returned as is."""
    if None in values or math.inf in values or -math.inf in values:
        return [encode_number(v) for v in values]
    return values  # type: ignore[return-value]


def attempt_keys(conn: Any, attempt_id: int) -> list[str]:
    return [
        r[0]
        for r in conn.execute("SELECT key FROM metric_keys WHERE attempt_id = ? ORDER BY key", (attempt_id,))
    ]


def read_steps(
    db: Database, attempt_id: int, after: int, limit: int, keys: list[str] | None
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to `limit` steps after `after`, each with its values; and the cursor for the next page."""
    with db.raw_read() as conn:
        wanted = keys or attempt_keys(conn, attempt_id)
        by_step: dict[int, dict[str, Any]] = {}
        for key in wanted:
            # Each series' first `limit` steps contain every step of the merged page's first `limit`.
            for step, value in conn.execute(
                "SELECT step, value FROM metric_points WHERE attempt_id = ? AND key = ? AND step > ? "
                "ORDER BY step LIMIT ?",
                (attempt_id, key, after, limit),
            ):
                by_step.setdefault(step, {})[key] = encode_number(value)
    steps = sorted(by_step)[:limit]
    points = [{"step": s, "values": by_step[s]} for s in steps]
    return points, (steps[-1] if len(steps) == limit else None)


def read_series(db: Database, attempt_id: int, key: str, after: int, limit: int) -> dict[str, Any]:
    with db.raw_read() as conn:
        rows = conn.execute(
            "SELECT step, value FROM metric_points WHERE attempt_id = ? AND key = ? AND step > ? "
            "ORDER BY step LIMIT ?",
            (attempt_id, key, after, limit),
        ).fetchall()
    steps, values = (list(column) for column in zip(*rows, strict=True)) if rows else ([], [])
    return {
        "key": key,
        "steps": steps,
        "values": json_numbers(values),
        "next_after": steps[-1] if len(steps) == limit else None,
    }


def read_downsampled(db: Database, attempt_id: int, keys: list[str] | None, buckets: int) -> dict[str, Any]:
    """Each series cut into at most `buckets` step ranges with min, max and last value: peaks survive.

    Long series are read from the coarsest rollup level finer than the bucket width asked for, so a
    million points cost a few thousand rows; short ones straight from the points.
    """
    with db.raw_read() as conn:
        wanted = keys or attempt_keys(conn, attempt_id)
        series: dict[str, Any] = {}
        for key in wanted:
            # Two single-aggregate queries: each is one index probe, where min+max+count scans the series.
            lo = conn.execute(_FIRST_STEP, (attempt_id, key)).fetchone()[0]
            if lo is None:
                continue
            hi = conn.execute(_LAST_STEP, (attempt_id, key)).fetchone()[0]
            asked = math.ceil((hi - lo + 1) / buckets)
            level = max((lv for lv in ROLLUP_LEVELS if 1 << lv <= asked), default=None)
            if level is None:
                series[key] = _downsample_points(conn, attempt_id, key, lo, max(1, asked))
            else:
                series[key] = _downsample_rollups(conn, attempt_id, key, lo, hi, level, buckets)
    return {"attempt_id": attempt_id, "buckets": buckets, "series": series}


def _downsample_points(conn: Any, attempt_id: int, key: str, lo: int, width: int) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT (step - ?) / ? AS b, max(step), min(value), max(value), count(*), "
        "sum(value IS NULL) FROM metric_points WHERE attempt_id = ? AND key = ? GROUP BY b ORDER BY b",
        (lo, width, attempt_id, key),
    ).fetchall()
    last_steps = [r[1] for r in rows]
    last_values = dict(
        conn.execute(
            f"SELECT step, value FROM metric_points WHERE attempt_id = ? AND key = ? "
            f"AND step IN ({','.join('?' * len(last_steps))})",
            (attempt_id, key, *last_steps),
        ).fetchall()
    )
    return {
        "points": sum(r[4] for r in rows),
        "bucket_width": width,
        "steps": last_steps,
        "min": [encode_number(r[2]) if r[5] < r[4] else NAN for r in rows],
        "max": [encode_number(r[3]) if r[5] < r[4] else NAN for r in rows],
        "last": [encode_number(last_values.get(s)) for s in last_steps],
    }


def _downsample_rollups(
    conn: Any, attempt_id: int, key: str, lo: int, hi: int, level: int, buckets: int
) -> dict[str, Any]:
    # Buckets are whole runs of rollup buckets, so their width is a multiple of 2**level.
    first = lo >> level
    per = math.ceil(((hi >> level) - first + 1) / buckets)
    rows = conn.execute(
        "SELECT bucket, lo, hi, n, last_step, last_value FROM metric_rollups "
        "WHERE attempt_id = ? AND key = ? AND level = ? ORDER BY bucket",
        (attempt_id, key, level),
    ).fetchall()
    merged = _merge_up([[(r[0] - first) // per, *r[1:]] for r in rows], 0)
    return {
        "points": sum(m[3] for m in merged),
        "bucket_width": per << level,
        "steps": [m[4] for m in merged],
        "min": json_numbers([m[1] for m in merged]),
        "max": json_numbers([m[2] for m in merged]),
        "last": json_numbers([m[5] for m in merged]),
    }


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
            summaries = _merge_up(summaries, level - below)
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


def _merge_up(rows: list[list[Any]], shift: int) -> list[list[Any]]:
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


def store_log_chunk(
    db: Database, attempt_id: int, job_id: int, offset: int, text: str, length: int | None = None
) -> None:
    """Keep file bytes [offset, offset + length); a resend from the same offset only ever extends it.

    `length` is the chunk's size in the agent's file; it differs from the UTF-8 text's size when
    the agent replaced undecodable bytes, and offsets must follow the file.
    """
    data = text.encode("utf-8", "replace")
    length = len(data) if length is None else length
    if len(data) > MAX_LOG_CHUNK_BYTES:
        raise BadReport(f"text: at most {MAX_LOG_CHUNK_BYTES} bytes per chunk; send smaller chunks")
    with db.raw_write() as conn:
        conn.execute(
            'INSERT INTO log_chunks (attempt_id, "offset", job_id, length, data, time) VALUES (?, ?, ?, ?, ?, ?) '
            'ON CONFLICT (attempt_id, "offset") DO UPDATE SET data = excluded.data, length = excluded.length '
            "WHERE excluded.length > log_chunks.length",
            (attempt_id, offset, job_id, length, data, time.time()),
        )


def read_log(db: Database, attempt_id: int, offset: int, max_bytes: int) -> dict[str, Any]:
    """Text from byte `offset` on (at most about `max_bytes`), and where the next read starts."""
    parts: list[bytes] = []
    position = offset
    with db.raw_read() as conn:
        rows = conn.execute(
            'SELECT "offset", length, data FROM log_chunks WHERE attempt_id = ? AND "offset" + length > ? '
            'ORDER BY "offset"',
            (attempt_id, offset),
        )
        for chunk_offset, length, data in rows:
            if chunk_offset > position:
                break  # a gap: that part has not arrived yet
            parts.append(bytes(data) if chunk_offset == position else bytes(data)[position - chunk_offset :])
            position = chunk_offset + length
            if position - offset >= max_bytes:
                break
    return {"offset": offset, "next_offset": position, "text": b"".join(parts).decode("utf-8", "replace")}


def log_tail(db: Database, attempt_id: int, max_bytes: int) -> str:
    with db.raw_read() as conn:
        row = conn.execute(
            'SELECT max("offset" + length) FROM log_chunks WHERE attempt_id = ?', (attempt_id,)
        ).fetchone()
    end = int(row[0] or 0)
    return str(read_log(db, attempt_id, max(0, end - max_bytes), max_bytes)["text"])


def _event_data(data: Any, index: int) -> str:
    try:
        return orjson.dumps(data or {}).decode()
    except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
        raise BadReport(f"events[{index}].data: cannot be stored ({exc}); send plain JSON numbers") from exc


def store_events(db: Database, attempt_id: int, job_id: int, events: list[dict[str, Any]]) -> tuple[int, int]:
    """Insert events; one already stored under the same (attempt, key) is kept. Returns (accepted, dupes)."""
    now = time.time()
    rows = [
        (
            job_id,
            attempt_id,
            e.get("key"),
            e["kind"],
            e.get("code"),
            e.get("severity", "info"),
            e["message"],
            e.get("fix"),
            e.get("step"),
            _event_data(e.get("data"), index),
            e.get("time") or now,
        )
        for index, e in enumerate(events)
    ]
    with db.raw_write() as conn:
        before = conn.total_changes
        conn.executemany(
            "INSERT OR IGNORE INTO events (job_id, attempt_id, key, kind, code, severity, message, fix, step, "
            "data, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        accepted = conn.total_changes - before
    return accepted, len(rows) - accepted
