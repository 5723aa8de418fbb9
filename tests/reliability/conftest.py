"""Fixtures for reliability and security tests: a fresh service with one worker, a running and a finished job."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.core.config import Settings
from tests.service.factories import USER, USER_TOKEN, WORKER, WORKER_TOKEN, cpu_inventory, recipe


@dataclass
class World:
    """Ids of real rows: a registered worker, a job it runs (with its attempt), and a cancelled job."""

    worker_id: int
    job_id: int
    attempt_id: int
    finished_job_id: int


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    return Settings(data_dir=data_dir, user_tokens=[USER_TOKEN], worker_tokens=[WORKER_TOKEN], **overrides)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path / "data")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def build_world(client: TestClient) -> World:
    """Submit two jobs, cancel the second while queued, and let one CPU worker claim the first."""
    registered = client.post("/workers", json={"name": "cpu-1", "inventory": cpu_inventory()}, headers=WORKER)
    assert registered.status_code == 201, registered.text
    worker_id = int(registered.json()["id"])
    submitted = client.post("/jobs", json=recipe(name="running"), headers=USER)
    assert submitted.status_code == 201, submitted.text
    job_id = int(submitted.json()["id"])
    finished = client.post("/jobs", json=recipe(name="finished"), headers=USER)
    assert finished.status_code == 201, finished.text
    finished_job_id = int(finished.json()["id"])
    cancelled = client.post(f"/jobs/{finished_job_id}/cancel", headers=USER)
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled", cancelled.text
    claimed = client.post(f"/workers/{worker_id}/claim", json={}, headers=WORKER)
    assert claimed.status_code == 200, claimed.text
    attempt = claimed.json()["attempt"]
    assert attempt["job_id"] == job_id
    return World(worker_id, job_id, int(attempt["id"]), finished_job_id)


@pytest.fixture
def world(client: TestClient) -> World:
    return build_world(client)
