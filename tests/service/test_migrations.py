"""The migrations create exactly the tables the models describe, on SQLite and on PostgreSQL."""

from __future__ import annotations

import flightdeck.service.models  # noqa: F401
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from flightdeck.service.core.db import alembic_config, migrate
from sqlalchemy import create_engine, inspect, text
from sqlmodel import SQLModel


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


def test_rollups_are_rekeyed_by_level_and_keep_every_summary(database_url: str) -> None:
    """Migration 0009: the same rows, keyed (attempt, level, bucket, key); and back on a downgrade."""
    migrate(database_url)
    command.downgrade(alembic_config(database_url), "0008")
    rows = [
        {"attempt_id": a, "key": k, "level": lv, "bucket": b, "lo": -1.5, "hi": 2.5, "n": 3, "last_step": b * 16,
         "last_value": None if b % 2 else 0.25}
        for a in (1, 2) for k in ("loss", "lr") for lv in (4, 6) for b in range(3)
    ]  # fmt: skip
    columns = ", ".join(rows[0])
    values = ", ".join(f":{name}" for name in rows[0])
    engine = create_engine(database_url)

    def stored_under(key: list[str]) -> None:
        engine.dispose()  # SQLite: the table was replaced under the pool's connections
        assert inspect(engine).get_pk_constraint("metric_rollups")["constrained_columns"] == key
        with engine.connect() as connection:
            stored = connection.execute(text(f"SELECT {columns} FROM metric_rollups")).mappings().all()
        assert sorted(map(dict, stored), key=repr) == sorted(rows, key=repr)

    try:
        with engine.begin() as connection:
            connection.execute(text(f"INSERT INTO metric_rollups ({columns}) VALUES ({values})"), rows)
        command.upgrade(alembic_config(database_url), "head")
        stored_under(["attempt_id", "level", "bucket", "key"])
        command.downgrade(alembic_config(database_url), "0008")
        stored_under(["attempt_id", "key", "level", "bucket"])
    finally:
        engine.dispose()
