"""Suite-wide settings: never reach a model hub."""

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.postgres_cluster import PostgresCluster, PostgresUnavailable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# pytest-xdist's workers (scripts/test.sh runs two) start with COLUMNS=80 and LINES=24: rich fixes a
# console's width for good when it is built with COLUMNS set, so the CLI's module-level consoles
# would print 80 columns whatever a test asks for. Without them the width is read at each print.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A worker's workspace on disk (tiny llamas saved with save_pretrained, small datasets), built once
    per session for every test that runs host preflight on it (tests/preflight, tests/cli)."""
    from tests.preflight.workspace import build_workspace

    return build_workspace(tmp_path_factory.mktemp("tiny-workspace"))


# --- the two databases ---------------------------------------------------------------------------
# Tests that take `database_url` (directly, or through tests/service's `settings`) run once on SQLite
# and once on a throw-away PostgreSQL cluster started for the session (bench/postgres_cluster.py).
# Where PostgreSQL cannot be started the PostgreSQL variants skip with the reason, except under
# FLIGHTDECK_REQUIRE_POSTGRES=1 (CI), where that is an error.


TEMPLATE_DB = "flightdeck_template"
_DATABASES = itertools.count()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    from flightdeck.service.core.db import migrate

    cluster = None
    try:
        cluster = PostgresCluster()
        cluster.start()
        # Every test database is a copy of one migrated template: a copy takes ~20 ms, migrating ~150 ms.
        migrate(cluster.create_database(TEMPLATE_DB))
    except PostgresUnavailable as exc:
        if cluster is not None:
            cluster.stop()
        if os.environ.get("FLIGHTDECK_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required here (FLIGHTDECK_REQUIRE_POSTGRES=1): {exc}")
        pytest.skip(f"PostgreSQL variant skipped: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.hookimpl(tryfirst=True)  # before -m selects: the mark must be there when it does
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`slow_on_postgres`: a large matrix whose logic does not depend on the database keeps its SQLite
    variant in the default run and moves its PostgreSQL one to the slow run (CI runs both)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            item.get_closest_marker("slow_on_postgres")
            and callspec is not None
            and callspec.params.get("database_url") == "postgres"
        ):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file, copied for every test as PostgreSQL's template database is: a copy
    takes ~1 ms, migrating ~150-300 ms, and some 200 tests of the default run start on SQLite."""
    from flightdeck.service.core.db import migrate

    path = tmp_path_factory.mktemp("sqlite-template") / "flightdeck.db"
    # Alembic's own connections leave the file in rollback-journal mode: the copy is the whole database
    # (the service turns WAL on when it opens it).
    migrate(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated database for one test: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        path = tmp_path / "data" / "flightdeck.db"
        path.parent.mkdir(parents=True)
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    name = f"test_{os.getpid()}_{next(_DATABASES)}"
    url = cluster.create_database(name, template=TEMPLATE_DB)
    try:
        yield url
    finally:
        cluster.drop_database(name)


@pytest.fixture
def database(database_url: str) -> Iterator[Any]:
    """A migrated flightdeck.service.core.db.Database on `database_url` (each database in turn), closed after."""
    from flightdeck.service.core.db import Database, migrate

    migrate(database_url)
    db = Database(database_url)
    yield db
    db.close()
