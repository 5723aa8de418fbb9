"""The run directory of one attempt: what the agent writes for the trainer and reads back from it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flightdeck.contracts import (
    ATTEMPT_FILE,
    CURSOR_FILE,
    LOG_FILE,
    METRICS_FILE,
    OUTPUT_DIR,
    PLAN_FILE,
    RECIPE_FILE,
    RESULT_FILE,
)

# Files a previous, unrelated use of the same directory may have left (a database restored from a backup
# hands out its job and attempt ids again, in its own folder; a fresh database has its own folder:
# flightdeck/launch/plan.py).
# A node's outbox where the executor carries the run files (worker/agent/outbox.py), and its progress.
OUTBOX_EVENTS_FILE = "outbox-events.jsonl"
OUTBOX_FINISH_FILE = "finish-report.json"
OUTBOX_RELAYED_FILE = "outbox-relayed.json"
_RUN_OUTPUTS = (
    LOG_FILE,
    METRICS_FILE,
    RESULT_FILE,
    CURSOR_FILE,
    OUTBOX_EVENTS_FILE,
    OUTBOX_FINISH_FILE,
    OUTBOX_RELAYED_FILE,
)
TAIL_BYTES = 64 * 1024


def write_json(path: Path, payload: Any) -> None:
    """Write atomically, so a reader (or the agent after a crash) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as out:
        json.dump(payload, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def prepare_run_dir(
    run_dir: Path, attempt: dict[str, Any], recipe: dict[str, Any], plan: dict[str, Any]
) -> None:
    """Create `run_dir` with recipe.json, plan.json, attempt.json and output/ for a new attempt. What an
    earlier attempt left there (another id, or the same id made at another moment) goes first: its log,
    metrics and reports are removed, its output/ is set aside as `output.replaced-<n>` (its model is
    kept, but no retry of this job resumes from its checkpoints: the retry searches output/)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    previous = read_json(run_dir / ATTEMPT_FILE)
    output = run_dir / OUTPUT_DIR
    if previous is not None and _identity(previous) != _identity(attempt):
        for name in _RUN_OUTPUTS:
            (run_dir / name).unlink(missing_ok=True)
        if output.is_dir() and any(output.iterdir()):
            _set_aside(output)
    output.mkdir(exist_ok=True)
    write_json(run_dir / RECIPE_FILE, recipe)
    write_json(run_dir / PLAN_FILE, plan)
    write_json(run_dir / ATTEMPT_FILE, {**attempt, "state": "running"})


def _identity(attempt: dict[str, Any]) -> tuple[str, Any]:
    """What tells two attempts apart for good: the id, and when the service made it (a database restored
    from a backup hands out the same ids again, in the same database's folder, never at the same moment)."""
    return str(attempt.get("attempt_id")), attempt.get("claimed_at")


def _set_aside(directory: Path) -> None:
    number = 1
    while True:
        try:
            directory.rename(directory.with_name(f"{directory.name}.replaced-{number}"))
            return
        except OSError:  # taken (by an earlier replacement): the next number
            if not directory.with_name(f"{directory.name}.replaced-{number}").exists():
                raise
            number += 1


def set_state(run_dir: Path, state: str, **facts: Any) -> None:
    """Record in attempt.json whether the agent still owes the service anything for this run."""
    attempt = read_json(run_dir / ATTEMPT_FILE) or {}
    write_json(run_dir / ATTEMPT_FILE, {**attempt, **facts, "state": state})


def log_tail(run_dir: Path) -> str:
    """The last TAIL_BYTES of output.log, decoded."""
    path = run_dir / LOG_FILE
    try:
        with open(path, "rb") as src:
            src.seek(max(0, path.stat().st_size - TAIL_BYTES))
            return src.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def unfinished_runs(runs_dir: Path, agent: str) -> list[tuple[Path, dict[str, Any]]]:
    """Run directories agent `agent` started and had not finished with (agents may share runs_dir)."""
    found = []
    for path in sorted(runs_dir.glob(f"*/{ATTEMPT_FILE}")):
        attempt = read_json(path)
        if attempt and attempt.get("state") == "running" and attempt.get("agent") == agent:
            found.append((path.parent, attempt))
    return found
