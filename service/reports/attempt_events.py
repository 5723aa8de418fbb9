"""Events of an attempt (preflight, launch, health): stored once per key, whatever is re-sent."""

from __future__ import annotations

import time
from typing import Any

import orjson

from service.core.db import Database
from service.reports.bad_report import BadReport


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
