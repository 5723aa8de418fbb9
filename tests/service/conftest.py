"""A real service per test: its own database (SQLite, then PostgreSQL: tests/conftest.py's
`database_url`), migrations applied, tokens configured."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flightdeck.service.api.app import create_app
from flightdeck.service.core.config import Settings
from tests.service.factories import USER, USER_TOKEN, WORKER, WORKER_TOKEN, cpu_inventory, enrolled


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    # Settings ignores names it does not know (extra="ignore", for the environment): a misspelt
    # override would leave a test running on the defaults without a word.
    unknown = set(overrides) - set(Settings.model_fields)
    assert not unknown, f"not fields of Settings: {sorted(unknown)}"
    return Settings(data_dir=data_dir, user_tokens=[USER_TOKEN], worker_tokens=[WORKER_TOKEN], **overrides)


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    settings = make_settings(tmp_path / "data", database_url_override=database_url)
    # The PostgreSQL variants once ran on SQLite (the setting was ignored): every test checks it.
    assert settings.database_url == database_url, (settings.database_url, database_url)
    return settings


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        served = test_client.app.state.flightdeck.db.dialect  # type: ignore[attr-defined]
        assert settings.database_url.startswith(served), (served, settings.database_url)
        yield test_client


@pytest.fixture
def worker_id(client: TestClient) -> int:
    answer = client.post("/workers", json={"name": "cpu-1", "inventory": cpu_inventory()}, headers=WORKER)
    assert answer.status_code == 201, answer.text
    return enrolled(answer)


@pytest.fixture
def user() -> dict[str, str]:
    return USER


@pytest.fixture
def worker() -> dict[str, str]:
    return WORKER
