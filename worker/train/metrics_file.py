"""Rank 0's metrics.jsonl: one JSON line per logged step or health event, written as it comes.

Every line goes to the operating system at once, steps included, in one write() with no Python buffer
in between: when a rank hangs (or is killed) right after a step, that step must already be in the file
for the stall watch (H003) to time the silence from it. (A plain loop's quick steps come in batches
100 ms old at most: flightdeck.worker.instrument.loop_watch.BATCH_SECONDS.)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
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
        # Unbuffered: each write() is the system call itself, no copy into a buffer and no flush after.
        self._handle = path.open("ab", buffering=0)

    def write(self, record: dict[str, Any]) -> None:
        if "time" not in record:
            record["time"] = time.time()
        self._write(encode_line(record))

    def _write(self, lines: bytes) -> None:
        written = self._handle.write(lines)
        if written != len(lines):  # a regular file takes the whole line; anything else may take less
            self._write_rest(memoryview(lines)[written or 0 :])

    def _write_rest(self, rest: memoryview) -> None:
        while rest:
            rest = rest[self._handle.write(rest) or 0 :]

    def step(self, step: int, values: dict[str, Any]) -> None:
        self.steps([(step, time.time(), values)])

    def steps(self, steps: Sequence[tuple[int, float, dict[str, Any]]]) -> None:
        """Several steps' records, each (step, its time, its values), in one write."""
        self._write(b"".join(encode_line({"type": "step", "step": n, "time": t, **v}) for n, t, v in steps))

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
