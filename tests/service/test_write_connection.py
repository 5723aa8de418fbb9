"""Writes of the hot paths: committed, rolled back on errors; on SQLite one connection, reopened after close."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from flightdeck.service.core.db import Database


@pytest.fixture
def db(database: Database) -> Database:
    return database


def _keys(db: Database) -> list[str]:
    with db.reading() as conn:
        return list(conn.execute(text("SELECT key FROM metric_keys ORDER BY key")).scalars())


def test_a_failed_write_leaves_nothing_and_the_next_one_commits(db: Database) -> None:
    with pytest.raises(RuntimeError), db.writing() as conn:
        conn.execute(text("INSERT INTO metric_keys (attempt_id, key) VALUES (1, 'lost')"))
        raise RuntimeError("the request failed half way")
    with db.writing() as conn:
        conn.execute(text("INSERT INTO metric_keys (attempt_id, key) VALUES (1, 'kept')"))
    assert _keys(db) == ["kept"]  # read through another connection: committed, and only that


def test_on_sqlite_the_same_connection_serves_every_write_until_closed(db: Database) -> None:
    if not db.is_sqlite:
        pytest.skip("SQLite only: PostgreSQL keeps its page cache in the server, so writes use the pool")
    with db.writing() as first:
        pass
    with db.reading() as reader, db.writing() as second:
        # Not the pooled connection a reader holds: the writer's page cache stays valid between batches.
        assert second is first and reader is not first
    db.close()
    with db.writing() as reopened:
        reopened.execute(text("INSERT INTO metric_keys (attempt_id, key) VALUES (2, 'after')"))
    assert _keys(db) == ["after"]
