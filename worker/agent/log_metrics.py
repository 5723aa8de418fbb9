"""The last resort for a script nothing else watched: the HF Trainer's own log lines, parsed into metrics.

A Trainer (or a framework that logs the same way) prints one dict per logged step,
`{'loss': '6.193', 'grad_norm': '3.653', 'learning_rate': '2e-05', 'epoch': '0.01'}` (transformers 5
prints the numbers as strings, older versions as floats). When a script job's run wrote no step record
(instrumentation off, or a framework the hooks do not know), the agent turns those lines into step
records before the final shipment, each marked `"parsed_from_log": 1` (metric values are numbers); the step is the line's ordinal.
The pinned form of H004 is judged over them as the callback judges it live (the Trainer logs its
pre-clip norm), and its warning, if any, follows the steps.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from flightdeck.contracts import LOG_FILE, METRICS_FILE, RECIPE_FILE
from flightdeck.recipe.schema import HealthSpec
from flightdeck.recipe.script_args import HF_TRAINING_DEFAULTS, read_script_arguments
from flightdeck.worker.train.metrics_file import MetricsFile, read_metrics
from flightdeck.worker.train.stuck_learning import (
    SCRIPT_SETTINGS,
    ClippedEveryStep,
    clipped_fix,
    clipped_message,
)

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
        recipe = _recipe(run_dir)
        metrics = MetricsFile(metrics_path)
        try:
            for step, record in enumerate(records, 1):
                metrics.step(step, {**record, "parsed_from_log": 1})
            pinned = pinned_norm_event(records, _clip_limit(recipe), _health(recipe))
            if pinned is not None:
                metrics.event(pinned)
        finally:
            metrics.close()
    return len(records)


def pinned_norm_event(
    records: list[dict[str, Any]], limit: float | None, health: HealthSpec
) -> dict[str, Any] | None:
    """H004, pinned form, over the parsed steps: the first window clipped at every step (the logged
    pre-clip norm at or above `limit`) while the loss did not fall from the run's start, as the event
    record the trainer writes (worker/train/health.py's event_record; torch stays out of the agent)."""
    if limit is None:  # no clipping: nothing is pinned
        return None
    judge = ClippedEveryStep(limit, health.flat_loss_patience)
    for step, record in enumerate(records, 1):
        found = judge.observe(record.get("loss"), record.get("grad_norm"))
        if found is not None:
            return {
                "code": "H004",
                "severity": "warn",
                "message": clipped_message(found),
                "fix": clipped_fix(found, SCRIPT_SETTINGS),
                "step": step,
                "data": {
                    "grad_norm": found.norm,
                    "max_grad_norm": found.limit,
                    "steps": found.steps,
                    "start_loss": found.start_loss,
                    "loss": found.last_loss,
                    "source": "parsed_from_log",
                },
            }
    return None


def _recipe(run_dir: Path) -> dict[str, Any]:
    try:
        recipe = json.loads((run_dir / RECIPE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return recipe if isinstance(recipe, dict) else {}


def _clip_limit(recipe: dict[str, Any]) -> float | None:
    """The clip the Trainer ran with, as far as the job says: the recipe's training.max_grad_norm, else
    the script's `--max_grad_norm`, else TrainingArguments' default (a limit set in the script's own
    code is not visible here). None: no clipping (0)."""
    training = recipe.get("training") or {}
    if "max_grad_norm" in training:
        limit = training["max_grad_norm"]
    else:
        args = (recipe.get("entrypoint") or {}).get("args") or []
        limit = read_script_arguments([str(a) for a in args]).values.get(
            "--max_grad_norm", HF_TRAINING_DEFAULTS["max_grad_norm"]
        )
    return float(limit) if isinstance(limit, (int, float)) and limit > 0 else None


def _health(recipe: dict[str, Any]) -> HealthSpec:
    try:
        return HealthSpec.model_validate(recipe.get("health") or {})
    except ValueError:
        return HealthSpec()


def _number(value: Any) -> float | None:
    try:
        return float(value)  # NaN and infinity kept: they are H001's signal
    except (TypeError, ValueError):
        return None
