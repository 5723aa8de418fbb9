"""The one write connection of the hot paths: committed, rolled back on errors, reopened after close."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.db import Database, migrate


@pytest.fixture
def db(tmp_path: Path) -> Database:
    url = f"sqlite:///{tmp_path / 'flightdeck.db'}"
    migrate(url)
    return Database(url)


def _keys(db: Database) -> list[str]:
    with db.raw_read() as conn:
        return [r[0] for r in conn.execute("SELECT key FROM metric_keys ORDER BY key")]


def test_a_failed_write_leaves_nothing_and_the_next_one_commits(db: Database) -> None:
    with pytest.raises(RuntimeError), db.raw_write() as conn:
        conn.execute("INSERT INTO metric_keys (attempt_id, key) VALUES (1, 'lost')")
        raise RuntimeError("the request failed half way")
    with db.raw_write() as conn:
        conn.execute("INSERT INTO metric_keys (attempt_id, key) VALUES (1, 'kept')")
    assert _keys(db) == ["kept"]  # read through another connection: committed, and only that


def test_the_same_connection_serves_every_write_until_closed(db: Database) -> None:
    with db.raw_write() as first:
        pass
    with db.raw_read() as reader, db.raw_write() as second:
        # Not the pooled connection a reader holds: the writer's page cache stays valid between batches.
        assert second is first and reader is not first
    db.close()
    with db.raw_write() as reopened:
        reopened.execute("INSERT INTO metric_keys (attempt_id, key) VALUES (2, 'after')")
    assert _keys(db) == ["after"]
    db.close()
