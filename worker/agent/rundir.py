"""The run directory of one attempt: what the agent writes for the trainer and reads back from it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flightdeck.contracts import (
    ATTEMPT_FILE,
    LOG_FILE,
    OUTPUT_DIR,
    PLAN_FILE,
    RECIPE_FILE,
)

# A node's outbox where the executor carries the run files (worker/agent/outbox.py), and its progress.
OUTBOX_EVENTS_FILE = "outbox-events.jsonl"
OUTBOX_FINISH_FILE = "finish-report.json"
OUTBOX_RELAYED_FILE = "outbox-relayed.json"
# Where an earlier attempt's files go when the directory is prepared for another (prepare_run_dir).
REPLACED_PREFIX = "replaced-"
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
    """Create `run_dir` with recipe.json, plan.json, attempt.json and output/ for a new attempt.

    What an earlier attempt left there (another id, or the same id made at another moment: a database
    restored from a backup hands out its job and attempt ids again, in its own folder) is moved into
    `replaced-<n>/`, all of it: its model is kept, but its metrics, log, outbox and end markers are not
    read as this attempt's (a rank's end marker would have the agent take a live run for one hung in
    teardown, H008), and no retry resumes from its checkpoints (the search reads output/ only)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if is_other_attempt(read_json(run_dir / ATTEMPT_FILE), attempt["attempt_id"], attempt.get("claimed_at")):
        set_aside(run_dir)
    (run_dir / OUTPUT_DIR).mkdir(exist_ok=True)
    write_json(run_dir / RECIPE_FILE, recipe)
    write_json(run_dir / PLAN_FILE, plan)
    write_json(run_dir / ATTEMPT_FILE, {**attempt, "state": "running"})


def is_other_attempt(previous: dict[str, Any] | None, attempt_id: Any, claimed_at: float | None) -> bool:
    """Whether `previous` (an attempt.json: attempt_id, claimed_at) is another attempt than this one. The
    id alone does not say: a database restored from a backup hands out the same ids again, in the same
    database's folder, never at the same moment."""
    if previous is None:
        return False
    return (str(previous.get("attempt_id")), previous.get("claimed_at")) != (str(attempt_id), claimed_at)


def set_aside(directory: Path) -> None:
    """Move every entry of `directory` but earlier replacements into the next free `replaced-<n>/`;
    attempt.json last, so that a move cut short leaves the rest to be moved by the next preparation."""
    number = 1
    while (directory / f"{REPLACED_PREFIX}{number}").exists():
        number += 1
    aside = directory / f"{REPLACED_PREFIX}{number}"
    aside.mkdir()
    entries = [e for e in directory.iterdir() if e != aside and not e.name.startswith(REPLACED_PREFIX)]
    for entry in sorted(entries, key=lambda e: e.name == ATTEMPT_FILE):
        entry.rename(aside / entry.name)


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
