"""Events of an attempt (preflight, launch, health): stored once per key, whatever is re-sent."""

from __future__ import annotations

import time
from typing import Any

import orjson

from flightdeck.service.core.db import Database
from flightdeck.service.core.sql import upsert
from flightdeck.service.core.tables import events as events_table
from flightdeck.service.reports.bad_report import BadReport


def _event_data(data: Any, index: int) -> Any:
    try:
        orjson.dumps(data or {})
    except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
        raise BadReport(f"events[{index}].data: cannot be stored ({exc}); send plain JSON numbers") from exc
    return data or {}


def store_events(db: Database, attempt_id: int, job_id: int, events: list[dict[str, Any]]) -> tuple[int, int]:
    """Insert events; one already stored under the same (attempt, key) is kept. Returns (accepted, dupes)."""
    now = time.time()
    rows = [
        {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "key": e.get("key"),
            "kind": e["kind"],
            "code": e.get("code"),
            "severity": e.get("severity", "info"),
            "message": e["message"],
            "fix": e.get("fix"),
            "step": e.get("step"),
            "data": _event_data(e.get("data"), index),
            "time": e.get("time") or now,
        }
        for index, e in enumerate(events)
    ]
    if not rows:
        return 0, 0
    with db.writing() as conn:
        # A NULL key never conflicts (both databases treat NULLs as distinct): such events always land.
        # Counted by RETURNING: a many-row INSERT's rowcount is -1 on PostgreSQL (metric_ingest.py).
        stmt = upsert(db.dialect, events_table).on_conflict_do_nothing().returning(events_table.c.id)
        accepted = len(conn.execute(stmt, rows).all())
    return accepted, len(rows) - accepted
