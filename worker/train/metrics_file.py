"""Rank 0's metrics.jsonl: one JSON line per logged step or health event, flushed as written."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

# How strict JSON carries non-finite numbers (docs/contracts.md); the agent ships them as they are.
NON_FINITE = ("NaN", "Infinity", "-Infinity")


def json_safe(value: Any) -> Any:
    """Non-finite floats as "NaN"/"Infinity"/"-Infinity" (docs/contracts.md), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE[0] if math.isnan(value) else NON_FINITE[1 if value > 0 else 2]
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class MetricsFile:
    """Appends step records and events to `<run>/metrics.jsonl`; the agent tails it."""

    def __init__(self, path: Path):
        self.path = path
        self._handle = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        record.setdefault("time", time.time())
        try:
            line = json.dumps(record, allow_nan=False)
        except ValueError:  # a NaN or infinity somewhere (rare): spell it as the contract says
            line = json.dumps(json_safe(record), allow_nan=False)
        self._handle.write(line + "\n")
        self._handle.flush()

    def step(self, step: int, values: dict[str, Any]) -> None:
        self.write({"type": "step", "step": step, "time": time.time(), **values})

    def event(self, event: dict[str, Any]) -> None:
        self.write({"type": "event", "time": time.time(), **event})

    def close(self) -> None:
        self._handle.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl file, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
