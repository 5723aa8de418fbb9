"""A database holding one running job whose metric batches go straight into the ingestion code (no
service, no worker): for tests of how points are stored and read back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import insert

from flightdeck.service.core.db import Database, migrate
from flightdeck.service.core.tables import jobs

ATTEMPT, JOB = 7, 3


@contextmanager
def running_job_database(url: str) -> Iterator[Database]:
    """The migrated database at `url` with job JOB running (its attempt ATTEMPT stores the points)."""
    migrate(url)
    database = Database(url)
    with database.writing() as conn:
        conn.execute(
            insert(jobs).values(
                id=JOB, name="j", status="running", priority=0, max_attempts=1, attempt_count=1,
                created_at=0, updated_at=0, recipe={}, effective_recipe={}, findings=[],
                req_accelerator="cpu", req_devices=1, req_min_capability=0, req_gpu_memory_mb=0,
            )
        )  # fmt: skip
    try:
        yield database
    finally:
        database.close()
