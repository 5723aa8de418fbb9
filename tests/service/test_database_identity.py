"""Each database has its own id, made when its schema is created, and its attempts' run directories are
under it: job and attempt ids start again at 1 in a fresh database, and without the id the first job
of a new database reused the run directory the old database's job 1 had left in the same workspace."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flightdeck.service.api.app import create_app
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER, cpu_inventory, recipe

_NAMES = count()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """Factory of new, empty databases (not copies of the suite's migrated template, which share its
    id as a restored backup would): the service migrates each when it starts."""
    made: list[str] = []

    def make() -> str:
        if request.param == "sqlite":
            return f"sqlite:///{tmp_path / f'db-{next(_NAMES)}' / 'flightdeck.db'}"
        name = f"fresh_{os.getpid()}_{next(_NAMES)}"
        made.append(name)
        return str(request.getfixturevalue("postgres_cluster").create_database(name))

    yield make
    for name in made:
        request.getfixturevalue("postgres_cluster").drop_database(name)


def _first_job_on(client: TestClient) -> tuple[str, str]:
    """Register the same worker, submit a job and claim it: (the database's id, the plan's run_dir)."""
    answer = client.post("/workers", json={"name": "cpu-1", "inventory": cpu_inventory()}, headers=WORKER)
    assert answer.status_code == 201, answer.text
    registered = answer.json()
    assert client.post("/jobs", json=recipe(), headers=USER).json()["id"] == 1  # ids start again
    claim = client.post(
        f"/workers/{registered['id']}/claim",
        json={},
        headers={"Authorization": f"Bearer {registered['token']}"},
    )
    assert claim.status_code == 200, claim.text
    return registered["database"], claim.json()["attempt"]["plan"]["run_dir"]


def test_a_fresh_database_puts_its_run_directories_where_no_other_database_has(
    tmp_path: Path, fresh_database: Callable[[], str]
) -> None:
    seen = []
    for name in ("first", "second"):
        settings = make_settings(tmp_path / name, database_url_override=fresh_database())
        with TestClient(create_app(settings)) as client:
            database, run_dir = _first_job_on(client)
        assert re.fullmatch(r"\d{8}-[0-9a-f]{8}", database), database  # the day it was made, and chance
        assert run_dir == f"/ws/runs/{database}/job-1-attempt-1"
        with TestClient(create_app(settings)) as restarted:  # a restart keeps the database's id
            assert restarted.app.state.flightdeck.db.database_id == database  # type: ignore[attr-defined]
        seen.append(run_dir)
    assert seen[0] != seen[1]
