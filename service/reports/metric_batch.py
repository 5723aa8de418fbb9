"""A metric batch as the agents send it, parsed and validated by hand (orjson, no pydantic per point:
the hottest route); flightdeck/contracts.py has the limits and the published schema. Stored by
service/reports/metric_ingest.py, folded into rollups by service/reports/metric_rollups.py."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import orjson

from flightdeck.contracts import MAX_POINTS_PER_BATCH, METRIC_KEY, NON_FINITE_IN, STEP_LIMIT
from flightdeck.service.reports.bad_report import BadReport


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
    """A parsed batch, kept per metric: each key's steps, values and times in arrival order (lists that
    metrics may share: read them, do not change them)."""

    series: dict[str, tuple[list[int], list[float | None], list[float]]] = field(default_factory=dict)
    count: int = 0

    def rows(self, attempt_id: int, job_id: int) -> list[tuple[Any, ...]]:
        """metric_points rows (POINT_COLUMNS), key by key: consecutive rows land next to each other."""
        rows: list[tuple[Any, ...]] = []
        for key, (steps, values, stamps) in self.series.items():
            # zip builds the tuples in C: 45 us for 1,000 rows against 57 us as a comprehension.
            rows += zip(repeat(attempt_id), repeat(key), steps, repeat(job_id), values, stamps)
        return rows


def parse_metric_batch(body: bytes) -> ParsedBatch:
    """A `{"points": [{"step", "values", "time"}]}` body, validated value by value."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReport(f"body is not valid JSON: {exc}") from exc
    points = payload.get("points") if isinstance(payload, dict) else None
    if not isinstance(points, list):
        raise BadReport("points: required, a list of {step, values, time}")
    batch = _uniform_batch(points)
    return batch if batch is not None else _any_batch(points)


# The value types a uniform batch may hold; JSON gives no NaN float (NaN arrives as a string).
_PLAIN_VALUES = {float, int, type(None)}


def _uniform_batch(points: list[Any]) -> ParsedBatch | None:
    """The batch every agent sends, parsed metric by metric instead of value by value: every point an
    object with the same metric names, an integer step, a number or no time, and numbers or nulls as
    values. None when any of that does not hold: `_any_batch` then parses it, and names what is wrong.

    The metrics share one list of steps and one of times (read-only, as every list of a ParsedBatch).
    Measured on 1,000-point batches of 10 metrics: 0.17 ms instead of 0.25 ms, orjson's 0.08 ms included.
    """
    if not points or type(points[0]) is not dict or type(points[0].get("values")) is not dict:
        return None
    names = points[0]["values"].keys()
    if not names or not all(METRIC_KEY.fullmatch(name) for name in names):
        return None
    if len(points) * len(names) > MAX_POINTS_PER_BATCH:
        return None
    rows: list[dict[str, Any]] = []
    steps: list[int] = []
    stamps: list[float] = []
    now = time.time()
    for point in points:
        if type(point) is not dict:
            return None
        values, step, stamp = point.get("values"), point.get("step"), point.get("time")
        if type(values) is not dict or values.keys() != names:
            return None
        if type(step) is not int or not 0 <= step < STEP_LIMIT:
            return None
        if stamp is None:  # a line without a time: the arrival time is the best we know
            stamp = now
        elif type(stamp) is not float and type(stamp) is not int:
            return None
        rows.append(values)
        steps.append(step)
        stamps.append(stamp)
    batch = ParsedBatch(count=len(points) * len(names))
    for name in names:
        column = [values[name] for values in rows]
        kinds = set(map(type, column))
        if kinds != {float}:
            if not kinds <= _PLAIN_VALUES:
                return None
            column = [None if value is None else float(value) for value in column]
        batch.series[name] = (steps, column, stamps)
    return batch


def _any_batch(points: list[Any]) -> ParsedBatch:
    """Any batch, value by value: mixed metric names, non-finite values as strings, and every error
    named by its point and metric."""
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
