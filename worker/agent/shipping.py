"""Tails a run's output.log and metrics.jsonl and ships them with a durable cursor per file.

The cursor (<run>/shipped.json) is written only after the service acknowledged a batch, so a
restart resumes where the last acknowledged batch ended; every call is idempotent on the
service side, so a batch re-sent after a crash is never stored twice. A log chunk's end is
recorded before it is sent, so a re-send covers exactly the same bytes at the same offset.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Protocol

from worker.agent.client import ServiceRefused

log = logging.getLogger("flightdeck.agent")

CURSOR_FILE = "shipped.json"
LOG_FILE = "output.log"
METRICS_FILE = "metrics.jsonl"
MAX_LOG_CHUNK = 256 * 1024
MAX_METRIC_LINES = 500
SEVERITIES = ("info", "warn", "error", "fatal")
_NON_FINITE = ("NaN", "Infinity", "-Infinity")


class Reports(Protocol):
    def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None: ...
    def send_events(self, attempt_id: str, events: list[dict[str, Any]]) -> None: ...
    def send_log(self, attempt_id: str, offset: int, text: str) -> None: ...


class Cursor:
    """Byte offsets acknowledged by the service, persisted atomically in the run directory."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / CURSOR_FILE
        state: dict[str, Any] = {}
        if self.path.exists():
            state = json.loads(self.path.read_text())
        self.log_offset: int = state.get("log_offset", 0)
        self.log_pending_end: int | None = state.get("log_pending_end")
        self.metrics_offset: int = state.get("metrics_offset", 0)

    def save(self) -> None:
        state = {
            "log_offset": self.log_offset,
            "log_pending_end": self.log_pending_end,
            "metrics_offset": self.metrics_offset,
        }
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            json.dump(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)


class RunShipper:
    """Ships what one attempt's run directory gained since the last acknowledged batch."""

    def __init__(self, run_dir: Path, attempt_id: str, reports: Reports):
        self.run_dir = run_dir
        self.attempt_id = attempt_id
        self.reports = reports
        self.cursor = Cursor(run_dir)

    def ship(self, final: bool = False) -> bool:
        """Send one batch of each file; True when something was sent. `final`: the writer has exited."""
        sent_log = self._ship_log(final)
        sent_metrics = self._ship_metrics(final)
        return sent_log or sent_metrics

    def drain(self) -> None:
        """Ship everything left (the writer has exited)."""
        while self.ship(final=True):
            pass

    def _ship_log(self, final: bool) -> bool:
        path = self.run_dir / LOG_FILE
        if not path.exists():
            return False
        cursor = self.cursor
        with open(path, "rb") as src:
            src.seek(cursor.log_offset)
            if cursor.log_pending_end is not None:
                data = src.read(cursor.log_pending_end - cursor.log_offset)
            else:
                data = src.read(MAX_LOG_CHUNK)
                if not final and len(data) < MAX_LOG_CHUNK:
                    # Only whole lines while the run writes, so a chunk never splits a character.
                    data = data[: data.rfind(b"\n") + 1]
        if not data:
            return False
        end = cursor.log_offset + len(data)
        if cursor.log_pending_end != end:
            cursor.log_pending_end = end
            cursor.save()
        try:
            self.reports.send_log(self.attempt_id, cursor.log_offset, data.decode("utf-8", errors="replace"))
        except ServiceRefused as exc:
            # Retrying a refused batch would block every later one; the bytes stay in the file.
            log.error("output.log bytes %d-%d refused, skipped: %s", cursor.log_offset, end, exc)
        cursor.log_offset, cursor.log_pending_end = end, None
        cursor.save()
        return True

    def _ship_metrics(self, final: bool) -> bool:
        path = self.run_dir / METRICS_FILE
        if not path.exists():
            return False
        points: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        offset = self.cursor.metrics_offset
        with open(path, "rb") as src:
            src.seek(offset)
            for _ in range(MAX_METRIC_LINES):
                line = src.readline()
                if not line or (not line.endswith(b"\n") and not final):
                    break
                record = _parse(line, offset)
                if record is not None:
                    if record.get("type") == "event":
                        events.append(event_from_record(record, offset))
                    else:
                        point = point_from_record(record)
                        if point is not None:
                            points.append(point)
                offset += len(line)
        if offset == self.cursor.metrics_offset:
            return False
        try:
            if points:
                self.reports.send_metrics(self.attempt_id, points)
            if events:
                self.reports.send_events(self.attempt_id, events)
        except ServiceRefused as exc:
            log.error(
                "metrics.jsonl bytes %d-%d refused, skipped: %s", self.cursor.metrics_offset, offset, exc
            )
        self.cursor.metrics_offset = offset
        self.cursor.save()
        return True


def _parse(line: bytes, offset: int) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        log.warning("metrics.jsonl: line at byte %d is not JSON; skipped", offset)
        return None
    return record if isinstance(record, dict) else None


def metric_value(value: Any) -> float | str | None:
    """A point value as the API takes it: finite floats, or the strings for non-finite ones."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, str) and value in _NON_FINITE:
        return value
    return None


def point_from_record(record: dict[str, Any]) -> dict[str, Any] | None:
    """A step line of metrics.jsonl -> {"step", "values", "time"}; None without a step."""
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    values = {}
    for key, raw in record.items():
        if key in ("type", "step", "time"):
            continue
        value = metric_value(raw)
        if value is not None:
            values[key] = value
    if not values:
        return None
    when = record.get("time")
    return {"step": step, "values": values, "time": when if isinstance(when, int | float) else None}


def event_from_record(record: dict[str, Any], offset: int) -> dict[str, Any]:
    """An event line of metrics.jsonl -> an API event keyed by its byte offset (stable across restarts)."""
    severity = record.get("severity")
    step = record.get("step")
    data = record.get("data")
    return {
        "key": f"metrics.jsonl@{offset}",
        "kind": str(record.get("kind") or "health"),
        "code": record.get("code"),
        "severity": severity if severity in SEVERITIES else "warn",
        "message": str(record.get("message") or ""),
        "fix": record.get("fix"),
        "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
        "data": json_safe(data) if isinstance(data, dict) else {},
    }


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as the API's strings (strict JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return metric_value(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
