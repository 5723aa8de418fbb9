"""PostgreSQL down for a while: every request answers 503 with Retry-After and a JSON detail (never a
plain-text 500), the CLI's client waits it out, and everything works again once the server is back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from bench.postgres_cluster import PostgresCluster, PostgresUnavailable
from flightdeck.cli.client_http import UserClient
from flightdeck.service.core.db import migrate
from tests.reliability.conftest import served
from tests.service.conftest import make_settings
from tests.service.factories import USER, USER_TOKEN, recipe

pytestmark = pytest.mark.slow


@pytest.fixture
def own_cluster() -> Iterator[PostgresCluster]:
    """A cluster of this test's own: it is stopped and started again, which the shared one must not be."""
    try:
        cluster = PostgresCluster().start()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL is not available: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def test_an_outage_answers_503_and_the_service_recovers(own_cluster: PostgresCluster, tmp_path: Path) -> None:
    url = own_cluster.create_database("outage")
    migrate(url)
    settings = make_settings(tmp_path / "data", database_url_override=url)
    with served(settings) as base, httpx.Client(base_url=base, headers=USER, timeout=30) as api:
        assert api.post("/jobs", json=recipe(name="before")).status_code == 201
        # The test cluster commits without waiting for the WAL (synchronous_commit=off): written out
        # first, so the crash below loses nothing that was acknowledged.
        engine = create_engine(url)
        with engine.connect() as conn:
            conn.execute(text("CHECKPOINT"))
        engine.dispose()
        own_cluster.halt()
        answers = [api.get("/jobs"), api.post("/jobs", json=recipe(name="during")), api.get("/jobs/1")]
        for answer in answers:
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"].isdigit()
            assert "database is unavailable" in answer.json()["detail"]
        # The CLI's client retries a 503 until the database is back (here after about 3 s).
        threading.Timer(3.0, own_cluster.resume).start()
        started = time.monotonic()
        with UserClient(base, USER_TOKEN) as client:
            listed = client.get("/jobs")
        assert time.monotonic() - started >= 2.0  # it waited rather than failing at once
        assert [job["name"] for job in listed["data"]] == ["before"]  # nothing half-written during it
        assert api.post("/jobs", json=recipe(name="after")).status_code == 201
