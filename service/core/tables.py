"""The tables as SQLAlchemy Core objects, for the statements the hot paths build (service/models.py
defines them)."""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table
from sqlmodel import SQLModel

from flightdeck.service.models import (
    Attempt,
    AttemptNode,
    DatabaseIdentity,
    Event,
    Job,
    LogChunk,
    MetricKey,
    MetricPoint,
    MetricRollup,
    Worker,
)


def _table(model: type[SQLModel]) -> Table:
    return cast(Table, model.__table__)  # type: ignore[attr-defined]


jobs = _table(Job)
attempts = _table(Attempt)
attempt_nodes = _table(AttemptNode)
workers = _table(Worker)
database_identity = _table(DatabaseIdentity)
events = _table(Event)
metric_points = _table(MetricPoint)
metric_keys = _table(MetricKey)
metric_rollups = _table(MetricRollup)
log_chunks = _table(LogChunk)
