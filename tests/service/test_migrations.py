"""The migrations create exactly the tables the models describe, on SQLite and on PostgreSQL."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlmodel import SQLModel

import service.models  # noqa: F401
from service.core.db import migrate


def test_models_and_migrations_agree(database_url: str) -> None:
    migrate(database_url)
    migrate(database_url)  # a second start is a no-op
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
            if engine.dialect.name == "sqlite":
                assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() in ("delete", "wal")
        assert diff == [], f"models changed without a migration: {diff}"
        assert {"jobs", "attempts", "workers", "metric_points", "log_chunks", "events"} <= set(
            inspect(engine).get_table_names()
        )
    finally:
        engine.dispose()


def test_steps_are_64_bit_on_every_database(database_url: str) -> None:
    """The API accepts steps up to 2**62; PostgreSQL's INTEGER would refuse them (migration 0006)."""
    migrate(database_url)
    engine = create_engine(database_url)
    try:
        columns = {c["name"]: c["type"] for c in inspect(engine).get_columns("metric_points")}
        if engine.dialect.name == "postgresql":
            assert str(columns["step"]) == "BIGINT"
        else:
            assert str(columns["step"]) == "INTEGER"  # SQLite's INTEGER is 64-bit
    finally:
        engine.dispose()
