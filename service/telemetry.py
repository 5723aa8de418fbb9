"""Metric points, log chunks and events: idempotent ingestion and cursor reads.

The ingestion path is hot (every rank's steps), so it parses with orjson, validates by hand and
inserts with executemany into a WITHOUT ROWID table keyed (attempt, key, step).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import orjson

from service.core.db import Database

MAX_POINTS_PER_BATCH = 100_000
MAX_LOG_CHUNK_BYTES = 4 * 1024 * 1024
_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]{0,63}$")
_NON_FINITE_IN = {
    "NaN": math.nan,
    "nan": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
    "inf": math.inf,
    "-inf": -math.inf,
}


class BadReport(ValueError):
    """A report body that cannot be stored; the message names the field and the fix."""


def _value(raw: Any, where: str) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise BadReport(f"{where}: must be a number, not a boolean")
    if isinstance(raw, (int, float)):
        value = float(raw)
    elif isinstance(raw, str) and raw in _NON_FINITE_IN:
        value = _NON_FINITE_IN[raw]
    else:
        raise BadReport(f"{where}: must be a number, null, 'NaN', 'Infinity' or '-Infinity'")
    return None if math.isnan(value) else value


def parse_metric_batch(body: bytes, attempt_id: int, job_id: int) -> tuple[list[tuple[Any, ...]], set[str]]:
    """Rows for metric_points from a `{"points": [{"step", "values", "time"}]}` body."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReport(f"body is not valid JSON: {exc}") from exc
    points = payload.get("points") if isinstance(payload, dict) else None
    if not isinstance(points, list):
        raise BadReport("points: required, a list of {step, values, time}")
    rows: list[tuple[Any, ...]] = []
    keys: set[str] = set()
    now = time.time()
    for index, point in enumerate(points):
        if not isinstance(point, dict):
            raise BadReport(f"points[{index}]: must be an object")
        step = point.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**62:
            raise BadReport(f"points[{index}].step: must be an integer from 0")
        values = point.get("values")
        if not isinstance(values, dict):
            raise BadReport(f"points[{index}].values: must be an object of metric name -> number")
        stamp = point.get("time", now)
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            raise BadReport(f"points[{index}].time: must be a UNIX time in seconds")
        for key, raw in values.items():
            if key not in keys:
                if not _KEY.match(key):
                    raise BadReport(
                        f"points[{index}].values.{key[:64]}: metric names are letters, digits, _./-"
                    )
                keys.add(key)
            rows.append((attempt_id, key, step, job_id, _value(raw, f"points[{index}].values.{key}"), stamp))
        if len(rows) > MAX_POINTS_PER_BATCH:
            raise BadReport(f"points: at most {MAX_POINTS_PER_BATCH} values per batch; send smaller batches")
    return rows, keys


def store_metrics(db: Database, attempt_id: int, job_id: int, body: bytes) -> tuple[int, int]:
    """Insert a batch; a point already stored for (attempt, key, step) is kept. Returns (accepted, dupes)."""
    rows, keys = parse_metric_batch(body, attempt_id, job_id)
    if not rows:
        return 0, 0
    last_step = max(r[2] for r in rows)
    losses = [r for r in rows if r[1] == "loss" and r[2] == last_step]
    with db.raw_write() as conn:
        before = conn.total_changes
        conn.executemany(
            "INSERT OR IGNORE INTO metric_points (attempt_id, key, step, job_id, value, time) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        accepted = conn.total_changes - before
        conn.executemany(
            "INSERT OR IGNORE INTO metric_keys (attempt_id, key) VALUES (?, ?)",
            [(attempt_id, k) for k in keys],
        )
        conn.execute(
            "UPDATE jobs SET last_step = ?, last_loss = coalesce(?, last_loss) "
            "WHERE id = ? AND (last_step IS NULL OR last_step <= ?)",
            (last_step, losses[0][4] if losses else None, job_id, last_step),
        )
    return accepted, len(rows) - accepted


def json_number(value: float | None) -> float | str:
    """JSON has no NaN or Infinity; send them as the strings the ingest side accepts."""
    if value is None:
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


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
                by_step.setdefault(step, {})[key] = json_number(value)
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
    steps = [r[0] for r in rows]
    return {
        "key": key,
        "steps": steps,
        "values": [json_number(r[1]) for r in rows],
        "next_after": steps[-1] if len(steps) == limit else None,
    }


def read_downsampled(db: Database, attempt_id: int, keys: list[str] | None, buckets: int) -> dict[str, Any]:
    """Each series cut into at most `buckets` step ranges with min, max and last value: peaks survive."""
    with db.raw_read() as conn:
        wanted = keys or attempt_keys(conn, attempt_id)
        series: dict[str, Any] = {}
        for key in wanted:
            lo, hi, count = conn.execute(
                "SELECT min(step), max(step), count(*) FROM metric_points WHERE attempt_id = ? AND key = ?",
                (attempt_id, key),
            ).fetchone()
            if not count:
                continue
            width = max(1, math.ceil((hi - lo + 1) / buckets))
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
            series[key] = {
                "points": count,
                "bucket_width": width,
                "steps": last_steps,
                "min": [json_number(r[2]) if r[5] < r[4] else "NaN" for r in rows],
                "max": [json_number(r[3]) if r[5] < r[4] else "NaN" for r in rows],
                "last": [json_number(last_values.get(s)) for s in last_steps],
            }
    return {"attempt_id": attempt_id, "buckets": buckets, "series": series}


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
            orjson.dumps(e.get("data") or {}).decode(),
            e.get("time") or now,
        )
        for e in events
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
