"""Health rules the service runs on the metric stream itself (H003 stall).

A stalled run sends no metrics line, so the trainer cannot report its own stall: the service
compares the time since the last step with the run's median step time. The first threshold
(stall_factor x median) records a warning; twice that (and at least a configured floor) orders
the attempt stopped, and the job fails with H003. Step times are the trainer's clock: workers and service are expected to keep
time with NTP, as leases already assume.
"""

from __future__ import annotations

import itertools
import statistics
import time

from annotated_types import Ge, Gt
from sqlalchemy import Connection, func, select, text
from sqlmodel import Session

from flightdeck.contracts import SCRIPT_END_EVENT
from flightdeck.recipe import Recipe
from flightdeck.recipe.schema import HealthSpec
from flightdeck.recipe.validate import expand_stages, planned_steps
from flightdeck.service.core.db import Database
from flightdeck.service.core.tables import attempts, events, jobs, metric_points
from flightdeck.service.job_events import record_event
from flightdeck.service.models import Attempt, Job

# Steps used for the median step time; enough to smooth evaluation pauses, recent enough to adapt.
RECENT_STEPS = 20
MIN_STEPS = 3


def _lowest_stall_factor() -> float:
    """The bound the recipe schema puts under health.stall_factor (the schema is the one source)."""
    metadata = HealthSpec.model_fields["stall_factor"].metadata
    bounds = [float(m.gt if isinstance(m, Gt) else m.ge) for m in metadata if isinstance(m, (Gt, Ge))]  # type: ignore[arg-type]
    return min(bounds)


MIN_STALL_FACTOR = _lowest_stall_factor()


def _step_times(conn: Connection, attempt_id: int) -> list[float]:
    p = metric_points.c
    rows = conn.execute(
        select(p.step, func.max(p.time))
        .where(p.attempt_id == attempt_id, p.key == "loss")
        .group_by(p.step)
        .order_by(p.step.desc())
        .limit(RECENT_STEPS + 1)
    ).all()
    return sorted(float(r[1]) for r in rows if r[1] is not None)


def _stage_ends(recipe: Recipe) -> set[int]:
    """The last step of each stage whose recipe fixes it (training.max_steps), counted across stages."""
    ends, end = set(), 0
    for stage in expand_stages(recipe):
        if stage.training is None or stage.training.max_steps is None:
            break  # epochs decide this stage's length: the trainer reports it when the stage starts
        end += stage.training.max_steps
        ends.add(end)
    return ends


def _reported_stage_end(conn: Connection, attempt_id: int) -> int | None:
    """The last planned step of the stage that started last, as the trainer reported it: its 'training
    started' event is at the stage's first step offset and carries the Trainer's max_steps (epochs x
    steps per epoch for an epoch-based stage)."""
    e = events.c
    rows = conn.execute(
        select(e.step, e.data)
        .where(e.attempt_id == attempt_id, e.code.is_(None), e.message.like("training started%"))
        .order_by(e.step.desc(), e.id.desc())
        .limit(1)
    ).all()
    for offset, data in rows:
        planned = data.get("max_steps") if isinstance(data, dict) else None
        if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0:
            return (offset or 0) + planned
    return None


def _script_ended(conn: Connection, attempt_id: int) -> bool:
    e = events.c
    found = conn.execute(
        select(e.id).where(e.attempt_id == attempt_id, e.key == SCRIPT_END_EVENT).limit(1)
    ).first()
    return found is not None


def _between_steps(conn: Connection, attempt_id: int, recipe: Recipe, last_step: int) -> bool:
    """Whether the run is past a stage's last planned step: saving, evaluating the final model, or
    loading the next stage, not stalled."""
    final = planned_steps(recipe)
    if (final is not None and last_step >= final) or last_step in _stage_ends(recipe):
        return True
    if _script_ended(conn, attempt_id):
        return True  # an instrumented script ended on every rank: a hang now is teardown, the agent's (H008)
    end = _reported_stage_end(conn, attempt_id)
    return end is not None and last_step >= end


def detect_stalls(
    db: Database,
    min_fatal_seconds: float,
    since: float,
    now: float | None = None,
    *,
    min_warn_seconds: float = 0.0,
) -> list[int]:
    """Warn about, then stop, running attempts whose steps stopped coming; returns attempts stopped.

    A stop also needs `min_fatal_seconds` of silence and a warning `min_warn_seconds`: a final save or
    an evaluation of a fast-stepping run is a long pause that is not a hang. A run at the last planned
    step of a stage is saving or loading the next stage, not stalled: planned from the recipe's
    max_steps, or for an epoch-based stage from the max_steps the trainer reports when the stage
    starts. Silence is counted from `since` (the service's start) at the earliest: while the service
    was down, steps waited on the workers' disks, not in a hang.

    The scan reads without the write lock (it runs every few seconds over every running attempt, and
    claims and ingestion must not wait for it); only the findings are written, each re-checked first.
    """
    now = now or time.time()
    findings: list[tuple[int, int, int, str, str, str]] = []
    a, j = attempts.c, jobs.c
    with db.reading() as conn:
        # An attempt with fewer than MIN_STEPS steps (its job's last_step is below MIN_STEPS - 1) has
        # no step time to judge yet: the filter keeps a queue of fresh claims out of the scan.
        running = conn.execute(
            select(a.id, a.job_id, j.last_step)
            .join_from(attempts, jobs, j.id == a.job_id)
            .where(
                a.status == "running",
                j.status == "running",
                a.stop_code.is_(None),
                j.last_step >= MIN_STEPS - 1,
            )
        ).all()
        for attempt_id, job_id, last_step in running:
            times = _step_times(conn, attempt_id)
            if len(times) < MIN_STEPS:
                continue
            median = statistics.median(b - a for a, b in itertools.pairwise(times))
            silent = now - max(times[-1], since)
            if median <= 0 or silent <= MIN_STALL_FACTOR * median:
                continue  # below the smallest factor a recipe may set: no need to read the recipe
            recipe = _recipe(conn.execute(select(j.effective_recipe).where(j.id == job_id)).scalar_one())
            factor = recipe.health.stall_factor
            if silent <= max(factor * median, min_warn_seconds):
                continue
            if _between_steps(conn, attempt_id, recipe, last_step):
                continue
            message = (
                f"no new step for {silent:.0f} s after step {last_step}, {silent / median:.0f}x the median "
                f"step time of {median:.2f} s"
            )
            key = f"stall:{last_step}"
            if silent > max(2 * factor * median, min_fatal_seconds):
                findings.append((attempt_id, job_id, last_step, f"{key}:fatal", "fatal", message))
            else:
                findings.append(
                    (attempt_id, job_id, last_step, f"{key}:warn", "warn", f"possible stall: {message}")
                )
    return _record(db, findings)


def _record(db: Database, findings: list[tuple[int, int, int, str, str, str]]) -> list[int]:
    """Write the scan's warnings and stop orders, for what is as the scan saw it.

    Between the scan and the write lock the attempt may have ended or been stopped, its job may have
    been cancelled, or a new step may have arrived: any of these voids the finding.
    """
    stopped: list[int] = []
    if not findings:
        return stopped
    with db.write() as session:
        for attempt_id, job_id, last_step, key, severity, message in findings:
            attempt = session.get(Attempt, attempt_id)
            job = session.get(Job, job_id)
            if attempt is None or attempt.status != "running" or attempt.stop_code is not None:
                continue
            if job is None or job.status != "running" or job.last_step != last_step:
                continue
            if severity == "fatal":
                attempt.stop_code = "H003"
                attempt.stop_message = message = f"stalled: {message}; the service stopped the run"
                session.add(attempt)
                stopped.append(attempt_id)
            _event_once(session, job_id, attempt_id, key, severity, message)
    return stopped


def _recipe(raw: object) -> Recipe:
    return Recipe.model_validate_json(raw) if isinstance(raw, (str, bytes)) else Recipe.model_validate(raw)


def _event_once(
    session: Session, job_id: int, attempt_id: int, key: str, severity: str, message: str
) -> None:
    exists = session.execute(
        text("SELECT 1 FROM events WHERE attempt_id = :a AND key = :k"), {"a": attempt_id, "k": key}
    ).first()
    if exists is None:
        record_event(session, job_id, attempt_id, "health", message, code="H003", severity=severity, key=key)
