"""The database: engine with SQLite tuned for a single writer, sessions, migrations at start-up."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlmodel import Session

MIGRATIONS_DIR = Path(
    os.environ.get("FLIGHTDECK_MIGRATIONS_DIR", Path(__file__).resolve().parents[2] / "migrations")
)


# 64 MiB of 4 KiB pages: the service's own checkpoints keep the WAL far below this.
WAL_AUTOCHECKPOINT_PAGES = 16384


def make_engine(url: str) -> Engine:
    """An engine; for SQLite: WAL, a busy timeout and foreign keys on every connection."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30.0}, pool_size=16)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        # NORMAL is durable across process crashes in WAL mode; only an OS crash may lose the last commit.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        # Series reads walk many pages: a larger page cache and memory-mapped reads keep them in memory.
        cursor.execute("PRAGMA cache_size=-16384")
        cursor.execute("PRAGMA mmap_size=268435456")
        # A checkpoint inside a commit copies and fsyncs under the write lock (measured: 100-200 ms
        # stalls of every claim under load). The service checkpoints from its reaper, outside the lock,
        # every pass (Database.checkpoint); this higher bound is only the backstop if that falls behind.
        cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        cursor.close()

    return engine


def migrate(url: str) -> None:
    """Create or upgrade the schema to the newest migration."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "head")


class Database:
    """Sessions for reads, and write sessions serialised by one lock.

    The service is the only writer. Serialising writes in-process means SQLite never answers
    'database is locked' to a request, and a read-then-write sequence is atomic.
    """

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._write_lock = threading.Lock()
        self._writer: Any = None

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        with self._write_lock, Session(self.engine, expire_on_commit=False) as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    @contextmanager
    def raw_write(self) -> Iterator[Any]:
        """The DB-API write connection under the write lock, for the hot paths (ingestion, claims).

        Always the same connection: SQLite drops a connection's page cache whenever another
        connection has written, so a pooled connection per batch re-read the b-tree pages every time.
        """
        with self._write_lock:
            if self._writer is None:
                self._writer = self.engine.raw_connection()  # kept checked out for the process
            dbapi = self._writer.dbapi_connection
            assert dbapi is not None
            try:
                yield dbapi
                dbapi.commit()
            except BaseException:
                dbapi.rollback()
                raise

    def close(self) -> None:
        """Return the write connection and close every pooled one."""
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self.engine.dispose()

    def checkpoint(self) -> None:
        """Copy the WAL back into the database: reads through a long WAL are slower (about 2.5x here).

        PASSIVE never blocks SQLite's writer or readers, so it runs outside the write lock: claims and
        ingestion do not wait for it, and SQLite copies pages without holding the GIL.
        """
        if self.url.startswith("sqlite"):
            with self.raw_read() as conn:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    @contextmanager
    def raw_read(self) -> Iterator[Any]:
        with self.engine.connect() as connection:
            yield connection.connection.dbapi_connection
