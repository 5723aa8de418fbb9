"""Rank 0's metrics.jsonl: one JSON line per logged step or health event, flushed as written.

Every line is flushed at once, steps included: when a rank hangs right after a step, that step must
already be on disk for the stall watch (H003) to time the silence from it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import orjson

from flightdeck.contracts import json_safe

# Values a flat step record holds; orjson writes them as json would (a float in its shortest form).
_FLAT = (int, str, bool, type(None))


class MetricsFile:
    """Appends step records and events to `<run>/metrics.jsonl`; the agent tails it."""

    def __init__(self, path: Path):
        self.path = path
        self._handle = path.open("ab")

    def write(self, record: dict[str, Any]) -> None:
        record.setdefault("time", time.time())
        self._handle.write(encode_line(record))
        self._handle.flush()

    def step(self, step: int, values: dict[str, Any]) -> None:
        self.write({"type": "step", "step": step, "time": time.time(), **values})

    def event(self, event: dict[str, Any]) -> None:
        self.write({"type": "event", "time": time.time(), **event})

    def close(self) -> None:
        self._handle.close()


def encode_line(record: dict[str, Any]) -> bytes:
    """One metrics.jsonl line. A step's flat record of finite numbers goes through orjson (about 1 us,
    json.dumps about 20 us per step); anything else (a NaN or infinity, an event's nested data, a type
    orjson does not take) through json, with non-finite numbers spelled as the contract says."""
    if _flat_and_finite(record):
        try:
            return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # an int beyond 64 bits, a key that is not a string
            pass
    try:
        line = json.dumps(record, allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere (rare): spell it as the contract says
        line = json.dumps(json_safe(record), allow_nan=False)
    return (line + "\n").encode("utf-8")


def _flat_and_finite(record: dict[str, Any]) -> bool:
    """No nested value and no NaN or infinity (orjson would write those as null)."""
    for value in record.values():
        kind = type(value)
        if kind is float:
            if not math.isfinite(value):
                return False
        elif kind not in _FLAT:
            return False
    return True


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl file, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
