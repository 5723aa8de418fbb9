"""The last resort for a script nothing else watched: the HF Trainer's own log lines, parsed into metrics.

A Trainer (or a framework that logs the same way) prints one dict per logged step,
`{'loss': '6.193', 'grad_norm': '3.653', 'learning_rate': '2e-05', 'epoch': '0.01'}` (transformers 5
prints the numbers as strings, older versions as floats). When a script job's run wrote no step record
(instrumentation off, or a framework the hooks do not know), the agent turns those lines into step
records before the final shipment, each marked `"parsed_from_log": 1` (metric values are numbers); the step is the line's ordinal.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from flightdeck.contracts import LOG_FILE, METRICS_FILE
from flightdeck.worker.train.metrics_file import MetricsFile, read_metrics

# A logged step's dict: starts with the loss key; a progress bar may share the line.
_LOGGED_STEP = re.compile(r"\{['\"]loss['\"]: [^{}]*\}")
_KEYS = ("loss", "grad_norm", "learning_rate", "epoch")


def parse_trainer_log(text: str) -> list[dict[str, Any]]:
    """One record per Trainer-style logged-step line, in order."""
    records = []
    for match in _LOGGED_STEP.finditer(text):
        try:
            logged = ast.literal_eval(match.group(0))
        except (ValueError, SyntaxError):
            continue
        record = {key: _number(logged.get(key)) for key in _KEYS if key in logged}
        if record.get("loss") is not None:
            records.append(record)
    return records


def fill_metrics_from_log(run_dir: Path) -> int:
    """Append the log's logged steps to metrics.jsonl when it has no step record; how many were added."""
    metrics_path = run_dir / METRICS_FILE
    if any(r.get("type") == "step" for r in read_metrics(metrics_path)):
        return 0
    try:
        text = (run_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0
    records = parse_trainer_log(text)
    if records:
        metrics = MetricsFile(metrics_path)
        try:
            for step, record in enumerate(records, 1):
                metrics.step(step, {**record, "parsed_from_log": 1})
        finally:
            metrics.close()
    return len(records)


def _number(value: Any) -> float | None:
    try:
        return float(value)  # NaN and infinity kept: they are H001's signal
    except (TypeError, ValueError):
        return None
