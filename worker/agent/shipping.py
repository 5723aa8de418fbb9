"""Tails a run's output.log and metrics.jsonl and ships them with a durable cursor per file.

The cursor (<run>/shipped.json) is written only after the service acknowledged a batch, so a
restart resumes where the last acknowledged batch ended; every call is idempotent on the
service side, so a batch re-sent after a crash is never stored twice. A log chunk's end is
recorded before it is sent, so a re-send covers exactly the same bytes at the same offset.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flightdeck.contracts import (
    CURSOR_FILE,
    LOG_FILE,
    METRICS_FILE,
    NAN,
    NEG_INF,
    POS_INF,
    attempt_event,
    json_safe,
)
from flightdeck.worker.agent.client import Reports, ServiceRefused

log = logging.getLogger("flightdeck.agent")

MAX_LOG_CHUNK = 256 * 1024
MAX_METRIC_LINES = 500
# A batch the service can never take (invalid body): skipping it is the only way past it.
UNPROCESSABLE = 422
# Over the service's body limit: the same data goes again in smaller batches.
TOO_LARGE = 413


class ShippingRefused(Exception):
    """The service refuses this worker (401/403, a wrong or rotated token): nothing is advanced."""


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

    def __init__(
        self,
        run_dir: Path,
        attempt_id: str,
        reports: Reports,
        *,
        node: int | None = None,
        metrics: bool = True,
    ):
        """`node`: the node whose log this is, for a worker that holds several nodes of the attempt;
        `metrics`: False on a node that only ships its log (rank 0, who writes the metrics, is elsewhere)."""
        self.run_dir = run_dir
        self.attempt_id = attempt_id
        self.reports = reports
        self.node = node
        self.metrics = metrics
        self.cursor = Cursor(run_dir)
        # Lowered after a 413, so the same lines go again in smaller batches.
        self.max_log_chunk = MAX_LOG_CHUNK
        self.max_metric_lines = MAX_METRIC_LINES

    def ship(self, final: bool = False) -> bool:
        """Send one batch of each file; True when something was sent. `final`: the writer has exited."""
        sent_log = self._ship_log(final)
        sent_metrics = self.metrics and self._ship_metrics(final)
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
                data = src.read(self.max_log_chunk)
                if not final and len(data) < self.max_log_chunk:
                    # Only whole lines while the run writes, so a chunk never splits a character.
                    data = data[: data.rfind(b"\n") + 1]
        if not data:
            return False
        end = cursor.log_offset + len(data)
        if cursor.log_pending_end != end:
            cursor.log_pending_end = end
            cursor.save()
        text = data.decode("utf-8", errors="replace")
        span = f"output.log bytes {cursor.log_offset}-{end}"
        delivered = self._deliver(
            lambda: self.reports.send_log(self.attempt_id, cursor.log_offset, text, len(data), self.node),
            span,
            splittable=len(data) > 1,
        )
        if not delivered:
            # 413: the next call re-reads a shorter chunk from the same offset (the service only
            # ever extends a chunk stored at an offset, so the shorter re-send is safe).
            self.max_log_chunk = max(1, len(data) // 2)
            cursor.log_pending_end = None
            cursor.save()
            return True
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
        lines = 0
        with open(path, "rb") as src:
            src.seek(offset)
            for _ in range(self.max_metric_lines):
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
                lines += 1
        if offset == self.cursor.metrics_offset:
            return False
        span = f"metrics.jsonl bytes {self.cursor.metrics_offset}-{offset}"
        # Each in its own call: a refused metrics batch must not take the window's health events with it.
        for send, batch in (
            (self.reports.send_metrics, points),
            (self.reports.send_events, events),
        ):
            if batch and not self._deliver(
                lambda send=send, batch=batch: send(self.attempt_id, batch), span, splittable=lines > 1
            ):
                self.max_metric_lines = max(1, lines // 2)
                return True  # 413: the same lines again, fewer at a time (re-sends are idempotent)
        self.cursor.metrics_offset = offset
        self.cursor.save()
        return True

    def _deliver(self, send: Callable[[], None], span: str, *, splittable: bool) -> bool:
        """Send once; False when the batch is too large and can be split; 422 skips the batch for good."""
        try:
            send()
        except ServiceRefused as exc:
            if exc.status_code == TOO_LARGE and splittable:
                log.warning("%s: too large for the service (413); sending smaller batches", span)
                return False
            if exc.status_code in (UNPROCESSABLE, TOO_LARGE):
                # Retrying a batch the service can never take would block every later one; the
                # bytes stay in the file.
                log.error("%s refused, skipped: %s", span, exc)
                return True
            log.error(
                "%s: the service refuses this worker (%s); shipping stops until it accepts again "
                "(check the worker token); nothing is lost, the data waits on disk",
                span,
                exc,
            )
            raise ShippingRefused(str(exc)) from exc
        return True


def _parse(line: bytes, offset: int) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        log.warning("metrics.jsonl: line at byte %d is not JSON; skipped", offset)
        return None
    return record if isinstance(record, dict) else None


def metric_value(value: Any) -> float | str | None:
    """A point value as the API takes it: a number, or the string of a non-finite one; else None."""
    value = json_safe(value)
    if isinstance(value, str):
        return value if value in (NAN, POS_INF, NEG_INF) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def point_from_record(record: dict[str, Any]) -> dict[str, Any] | None:
    """A step line of metrics.jsonl -> {"step", "values"[, "time"]}; None without a step."""
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
    point: dict[str, Any] = {"step": step, "values": values}
    when = record.get("time")
    if isinstance(when, int | float) and not isinstance(when, bool):
        point["time"] = when  # without one the service stamps the point on arrival
    return point


def event_from_record(record: dict[str, Any], offset: int) -> dict[str, Any]:
    """An event line of metrics.jsonl -> an API event keyed by its byte offset (stable across restarts)."""
    return attempt_event(
        f"{METRICS_FILE}@{offset}",
        str(record.get("kind") or "health"),
        str(record.get("message") or ""),
        code=record.get("code"),
        severity=str(record.get("severity")),
        fix=record.get("fix"),
        step=record.get("step"),
        data=record.get("data"),
    )
