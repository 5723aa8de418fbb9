"""The migrations create exactly the tables the models describe."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlmodel import SQLModel

import service.models  # noqa: F401
from service.core.db import migrate


def test_models_and_migrations_agree(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate(url)
    migrate(url)  # a second start is a no-op
    engine = create_engine(url)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
        journal = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
    assert diff == [], f"models changed without a migration: {diff}"
    assert {"jobs", "attempts", "workers", "metric_points", "log_chunks", "events"} <= set(
        inspect(engine).get_table_names()
    )
    assert journal in ("delete", "wal")
