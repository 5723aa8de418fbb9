"""A throw-away PostgreSQL cluster for the tests and benchmarks: started in about a second, removed after.

Debian's `postgresql` package provides the server (scripts/install-postgres.sh installs it). `initdb`
refuses to run as root, so as root the cluster belongs to the `postgres` user (runuser). It listens only
on a Unix socket in its own temporary directory, trusts local connections, and runs with fsync off:
it holds nothing that must survive the machine.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy import create_engine, text

PORT = 5432  # only names the socket file: no TCP port is opened


class PostgresUnavailable(RuntimeError):
    """Why no cluster could be started (the message is what a skipped test prints)."""


def server_bin_dir() -> Path | None:
    """The directory holding initdb and pg_ctl (the newest installed major version), or None."""
    for name in ("pg_ctl", "initdb"):
        found = shutil.which(name)
        if found and Path(found).resolve().with_name("pg_ctl").exists():
            return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


class PostgresCluster:
    """initdb + pg_ctl start in a temporary directory; `url(db)` for SQLAlchemy; `stop()` removes it."""

    def __init__(self) -> None:
        bin_dir = server_bin_dir()
        if bin_dir is None:
            raise PostgresUnavailable(
                "PostgreSQL is not installed (no initdb/pg_ctl); run scripts/install-postgres.sh as root"
            )
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="flightdeck-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, user="postgres", group="postgres")
        self.root.chmod(0o755)
        self.started = False

    def _run(self, *argv: str) -> None:
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{argv[0]} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}"
            )

    def start(self) -> PostgresCluster:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        self.resume()
        return self

    def halt(self) -> None:
        """Stop the server at once, as a crash would (its data is kept for `resume`)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.started = False

    def resume(self) -> None:
        """Start a halted server again on its data."""
        options = (
            f"-k {self.socket_dir} -p {PORT} -c listen_addresses='' -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"), "-w", "start"
        )
        self.started = True

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_dir}&port={PORT}"

    def create_database(self, name: str, template: str | None = None) -> str:
        """A new database (optionally a copy of `template`); returns its URL."""
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                clause = f" TEMPLATE {template}" if template else ""
                conn.execute(text(f'CREATE DATABASE "{name}"{clause}'))
        finally:
            engine.dispose()
        return self.url(name)

    def drop_database(self, name: str) -> None:
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        finally:
            engine.dispose()

    def stop(self) -> None:
        try:
            if self.started:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            self.started = False
            shutil.rmtree(self.root, ignore_errors=True)
