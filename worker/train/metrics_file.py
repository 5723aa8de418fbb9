"""Rank 0's metrics.jsonl: one JSON line per logged step or health event, flushed as written."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from flightdeck.service.contracts import json_safe


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
