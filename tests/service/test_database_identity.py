"""Each database has its own id, made when its schema is created, and its attempts' run directories are
under it: job and attempt ids start again at 1 in a fresh database, and without the id the first job
of a new database reused the run directory the old database's job 1 had left in the same workspace."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

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
    attempt = _first_claim(client, registered)
    return registered["database"], attempt["plan"]["run_dir"]


def _first_claim(client: TestClient, registered: dict[str, Any] | None = None) -> dict[str, Any]:
    """The claimed attempt of a first job (the worker `cpu-1` registered, unless it is given)."""
    if registered is None:
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
    return claim.json()["attempt"]  # type: ignore[no-any-return]


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


def test_a_database_restored_from_a_backup_tells_its_attempts_apart_by_when_they_were_made(
    tmp_path: Path,
) -> None:
    """A restored backup keeps the database's id, so its job 1 gets the very run directory and attempt id
    the job 1 made after the backup had: the claim's `claimed_at` differs (the worker compares it,
    worker/agent/rundir.py)."""
    live = tmp_path / "live"
    settings = make_settings(live, database_url_override=f"sqlite:///{live / 'db' / 'flightdeck.db'}")
    with TestClient(create_app(settings)):
        pass  # the schema and the database's id made: the backup is taken now
    shutil.copytree(live / "db", tmp_path / "backup")
    answers = []
    for _ in ("after the backup", "after the restore"):
        with TestClient(create_app(settings)) as client:
            answers.append(_first_claim(client))
        shutil.rmtree(live / "db")
        shutil.copytree(tmp_path / "backup", live / "db")
    (before, restored) = answers
    assert (restored["id"], restored["plan"]["run_dir"]) == (before["id"], before["plan"]["run_dir"])
    assert restored["claimed_at"] > before["claimed_at"]
