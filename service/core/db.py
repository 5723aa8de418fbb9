"""The database: SQLite (the embedded default) or PostgreSQL, one engine, sessions, migrations at start-up.

Every statement the service runs is SQLAlchemy Core or the ORM, so it compiles for either dialect;
where the two differ (upserts, `greatest`) service/core/sql.py has the one variant.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event
from sqlmodel import Session

MIGRATIONS_DIR = Path(
    os.environ.get("FLIGHTDECK_MIGRATIONS_DIR", Path(__file__).resolve().parents[2] / "migrations")
)


# 64 MiB of 4 KiB pages: the service's own checkpoints keep the WAL far below this.
WAL_AUTOCHECKPOINT_PAGES = 16384


# Job rows changed (submitted, claimed, finished) before the service analyzes `jobs` on PostgreSQL.
ANALYZE_AFTER_CHANGES = 1000

SUPPORTED_SCHEMES = ("sqlite:///", "postgresql+psycopg://")


def url_problem(url: str) -> str | None:
    """Why a database URL cannot be used (None: it can), in words that name the fix."""
    if url.startswith(SUPPORTED_SCHEMES):
        return None
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg2://")):
        return (
            "DATABASE_URL: use the psycopg 3 driver, postgresql+psycopg://user:password@host:5432/dbname "
            "(the one installed with the service)"
        )
    return (
        "DATABASE_URL: sqlite:///path/to/file.db or postgresql+psycopg://user:password@host:5432/dbname; "
        "unset it to use <data dir>/flightdeck.db"
    )


def _json_text(value: Any) -> str:
    """JSON columns as text: orjson (fast; NaN becomes null, which PostgreSQL's json type requires),
    the standard library for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value)


def make_engine(url: str) -> Engine:
    """An engine; for SQLite: WAL, a busy timeout and foreign keys on every connection."""
    # A pool of the thread pool's order: claims long-poll in threads and ingestion runs beside them.
    common: dict[str, Any] = {
        "pool_size": 16,
        "json_serializer": _json_text,
        "json_deserializer": orjson.loads,
    }
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True, max_overflow=16, **common)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30.0}, **common)

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


def alembic_config(url: str) -> Config:
    """Alembic's configuration for the project's migrations on `url`."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Alembic's ini interpolation would read a %-escaped password as a format directive.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(url: str) -> None:
    """Create or upgrade the schema to the newest migration (the same files for both databases)."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), "head")


class Database:
    """Sessions for reads, and writes serialised by one lock.

    Within one service process every write waits for the one before it: SQLite then never answers
    'database is locked' to a request, and a read-then-write sequence is atomic. Between service
    processes (PostgreSQL) the statements carry their own guards: the claim skips rows another
    transaction holds, and a job row is locked (FOR UPDATE) before its status is read to change it.
    """

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self.dialect: str = self.engine.dialect.name
        self._write_lock = threading.Lock()
        self._writer: Connection | None = None

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @contextmanager
    def read(self, *, snapshot: bool = False) -> Iterator[Session]:
        """An ORM session for reads, each statement on its own (reading()); with `snapshot`, all of
        them see one committed state (snapshot()): a read whose rows must agree with each other."""
        if not snapshot:
            with Session(self.engine, expire_on_commit=False) as session:
                yield session
            return
        # The session joins the transaction snapshot() began and never commits it.
        with self.snapshot() as connection, Session(bind=connection, expire_on_commit=False) as session:
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
    def writing(self) -> Iterator[Connection]:
        """A Core connection in a transaction under the write lock, for the hot paths (ingestion, claims).

        On SQLite always the same connection: SQLite drops a connection's page cache whenever another
        connection has written, so a pooled connection per batch re-read the b-tree pages every time.
        """
        with self._write_lock:
            if not self.is_sqlite:
                with self.engine.begin() as connection:
                    yield connection
                return
            if self._writer is None or self._writer.closed:
                self._writer = self.engine.connect()  # kept checked out for the process
            with self._writer.begin():
                yield self._writer

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A pooled Core connection for reads (no lock: readers never wait for writers).

        Each statement sees what was committed when it ran (SQLite's driver begins no transaction for
        a SELECT; PostgreSQL's READ COMMITTED takes a snapshot per statement). A read of several
        statements that must agree with each other uses snapshot().
        """
        with self.engine.connect() as connection:
            yield connection

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A read connection whose statements all see one committed state.

        A page of metrics is read key by key: a batch committed between two of its statements gave a
        step with some of its values, and the live stream's cursor went past the rest for good. Not
        the default: on SQLite the transaction doubles the cost of a one-statement read (35 -> 70 us,
        the token lookup every report makes).
        """
        with self.engine.connect() as connection:
            if self.is_sqlite:
                # Deferred: the first read fixes the snapshot (WAL); returning the connection rolls back.
                connection.exec_driver_sql("BEGIN")
            else:
                # The first statement of the transaction the driver opens; it lasts that transaction only.
                connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield connection

    @cached_property
    def database_id(self) -> str:
        """The id this database was given when created (models.DatabaseIdentity): it never changes, so
        it is read once."""
        with self.reading() as conn:
            value = conn.exec_driver_sql("SELECT database_id FROM database_identity WHERE id = 1").scalar()
        if not isinstance(value, str):
            raise RuntimeError("the database has no identity row: run its migrations (migration 0011)")
        return value

    def close(self) -> None:
        """Return the write connection and close every pooled one."""
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self.engine.dispose()

    def refresh_statistics(self) -> bool:
        """PostgreSQL: analyze `jobs` once ANALYZE_AFTER_CHANGES of its rows changed since the last
        analyze. True when it did.

        The claim's plan depends on them: after a burst of submissions, until autovacuum's next analyze
        (its nap is a minute), the planner takes the queued jobs for a handful and sorts every one of
        them per claim instead of reading ix_jobs_claim in order: 5.9 ms a claim with 10,000 queued,
        0.76 ms once analyzed (in-process, batches of 50). ANALYZE samples at most 30,000 rows, so a
        pass costs tens of milliseconds whatever the table's size.
        """
        if self.is_sqlite:
            return False  # SQLite's planner uses the index as written; it keeps no such statistics
        with self.reading() as conn:
            changed = conn.exec_driver_sql(
                "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'jobs'"
            ).scalar()
        if changed is None or changed < ANALYZE_AFTER_CHANGES:
            return False
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE jobs")
        return True

    def checkpoint(self) -> None:
        """SQLite: copy the WAL back into the database: reads through a long WAL are slower (about 2.5x).

        PASSIVE never blocks SQLite's writer or readers, so it runs outside the write lock: claims and
        ingestion do not wait for it, and SQLite copies pages without holding the GIL. PostgreSQL
        checkpoints on its own.
        """
        if self.is_sqlite:
            with self.reading() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
