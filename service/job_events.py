"""Events on a job's timeline that are not status changes (those are service/lifecycle.py's)."""

from __future__ import annotations

import time
from typing import Any

from sqlmodel import Session

from flightdeck.service.models import Event


def record_event(
    session: Session,
    job_id: int,
    attempt_id: int | None,
    kind: str,
    message: str,
    *,
    now: float | None = None,
    code: str | None = None,
    severity: str = "info",
    fix: str | None = None,
    data: dict[str, Any] | None = None,
    key: str | None = None,
) -> None:
    session.add(
        Event(
            job_id=job_id,
            attempt_id=attempt_id,
            key=key,
            kind=kind,
            code=code,
            severity=severity,
            message=message,
            fix=fix,
            data=data or {},
            time=now or time.time(),
        )
    )
