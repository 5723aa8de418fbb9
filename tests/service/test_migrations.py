"""The migrations create exactly the tables the models describe, on SQLite and on PostgreSQL."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlmodel import SQLModel

import flightdeck.service.models  # noqa: F401
from flightdeck.service.core.db import alembic_config, migrate


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


def test_every_attempt_gets_node_zero_with_its_lease_and_gives_it_back_on_a_downgrade(
    database_url: str,
) -> None:
    """Migration 0010: an attempt without node rows (one worker's, before) becomes node 0 of itself, its
    lease moved onto the node; a gang's rows are left as they are; a downgrade moves the lease back."""
    migrate(database_url)
    command.downgrade(alembic_config(database_url), "0009")
    engine = create_engine(database_url)
    job = (
        "INSERT INTO jobs (id, name, status, priority, max_attempts, attempt_count, created_at, updated_at, "
        "recipe, effective_recipe, findings, req_accelerator, req_devices, req_min_capability, "
        "req_gpu_memory_mb) VALUES (:id, 'j', 'running', 0, 2, 1, 1, 1, '{}', '{}', '[]', 'cpu', 1, 0, 0)"
    )
    attempt = (
        "INSERT INTO attempts (id, job_id, number, worker_id, status, started_at, finished_at, "
        "lease_expires_at, plan, findings, nnodes) VALUES (:id, :id, 1, :w, :status, 10, :finished, :lease, "
        "'{}', '[]', :nnodes)"
    )
    try:
        with engine.begin() as connection:
            for worker in (1, 2):
                connection.execute(
                    text(
                        "INSERT INTO workers (id, name, inventory, registered_at, last_seen_at) "
                        "VALUES (:id, :name, '{}', 1, 1)"
                    ),
                    {"id": worker, "name": f"w{worker}"},
                )
            for job_id in (1, 2, 3):
                connection.execute(text(job), {"id": job_id})
            connection.execute(
                text(attempt),
                {"id": 1, "w": 1, "status": "running", "finished": None, "lease": 500.0, "nnodes": 1},
            )
            connection.execute(
                text(attempt),
                {"id": 2, "w": 1, "status": "failed", "finished": 20.0, "lease": None, "nnodes": 1},
            )
            connection.execute(
                text(attempt),
                {"id": 3, "w": 1, "status": "running", "finished": None, "lease": None, "nnodes": 2},
            )
            for rank, worker in ((0, 1), (1, 2)):
                connection.execute(
                    text(
                        "INSERT INTO attempt_nodes (job_id, worker_id, attempt_id, node_rank, status, devices, "
                        "joined_at, lease_expires_at) VALUES (3, :w, 3, :rank, 'running', '[0]', 5, 700)"
                    ),
                    {"w": worker, "rank": rank},
                )
        command.upgrade(alembic_config(database_url), "head")
        engine.dispose()
        nodes = (
            "SELECT attempt_id, node_rank, worker_id, status, lease_expires_at, finished_at FROM attempt_nodes "
            "ORDER BY attempt_id, node_rank"
        )
        with engine.connect() as connection:
            assert [tuple(row) for row in connection.execute(text(nodes))] == [
                (1, 0, 1, "running", 500.0, None),
                (2, 0, 1, "failed", None, 20.0),
                (3, 0, 1, "running", 700.0, None),
                (3, 1, 2, "running", 700.0, None),
            ]
        assert "lease_expires_at" not in {c["name"] for c in inspect(engine).get_columns("attempts")}
        command.downgrade(alembic_config(database_url), "0009")
        engine.dispose()
        with engine.connect() as connection:
            leases = connection.execute(text("SELECT id, lease_expires_at FROM attempts ORDER BY id")).all()
            assert [tuple(row) for row in leases] == [(1, 500.0), (2, None), (3, None)]
            kept = connection.execute(text("SELECT DISTINCT attempt_id FROM attempt_nodes")).scalars().all()
            assert kept == [3]
    finally:
        engine.dispose()
