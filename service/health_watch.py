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

from sqlalchemy import text
from sqlmodel import Session

from service.core.db import Database
from service.jobs import record_event
from service.models import Attempt
from service.recipe import Recipe

# Steps used for the median step time; enough to smooth evaluation pauses, recent enough to adapt.
RECENT_STEPS = 20
MIN_STEPS = 3


def _step_times(session: Session, attempt_id: int) -> list[float]:
    rows = session.execute(
        text(
            "SELECT step, max(time) FROM metric_points WHERE attempt_id = :a AND key = 'loss' "
            "GROUP BY step ORDER BY step DESC LIMIT :n"
        ),
        {"a": attempt_id, "n": RECENT_STEPS + 1},
    ).all()
    return sorted(float(r[1]) for r in rows if r[1] is not None)


def detect_stalls(
    db: Database, min_fatal_seconds: float, since: float, now: float | None = None
) -> list[int]:
    """Warn about, then stop, running attempts whose steps stopped coming; returns attempts stopped.

    A stop also needs `min_fatal_seconds` of silence: a final save or an evaluation of a fast-stepping
    run is a long pause that is not a hang. Silence is counted from `since` (the service's start) at
    the earliest: while the service was down, steps waited on the workers' disks, not in a hang.
    """
    now = now or time.time()
    stopped: list[int] = []
    with db.write() as session:
        running = session.execute(
            text(
                "SELECT a.id, a.job_id, j.effective_recipe, j.last_step FROM attempts a "
                "JOIN jobs j ON j.id = a.job_id WHERE a.status = 'running' AND j.status = 'running' "
                "AND a.stop_code IS NULL"
            )
        ).all()
        for attempt_id, job_id, raw_recipe, last_step in running:
            times = _step_times(session, attempt_id)
            if len(times) < MIN_STEPS:
                continue
            median = statistics.median(b - a for a, b in itertools.pairwise(times))
            silent = now - max(times[-1], since)
            factor = _recipe(raw_recipe).health.stall_factor
            if median <= 0 or silent <= factor * median:
                continue
            message = (
                f"no new step for {silent:.0f} s after step {last_step}, {silent / median:.0f}x the median "
                f"step time of {median:.2f} s"
            )
            key = f"stall:{last_step}"
            if silent > max(2 * factor * median, min_fatal_seconds):
                attempt = session.get(Attempt, attempt_id)
                assert attempt is not None
                attempt.stop_code = "H003"
                attempt.stop_message = f"stalled: {message}; the service stopped the run"
                session.add(attempt)
                _event_once(session, job_id, attempt_id, f"{key}:fatal", "fatal", attempt.stop_message)
                stopped.append(attempt_id)
            else:
                _event_once(session, job_id, attempt_id, f"{key}:warn", "warn", f"possible stall: {message}")
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
