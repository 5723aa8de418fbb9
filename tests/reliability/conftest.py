"""Fixtures for reliability and security tests: a fresh service with one worker, a running and a finished job."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from flightdeck.service.api.app import create_app
from flightdeck.service.core.config import Settings

# The end-to-end harness of tests/agent, reused as is: a tiny workspace and a process factory.
from tests.agent.conftest import cluster, tiny_workspace  # noqa: F401

# The service tests' fixtures (a fresh service per test), shared rather than copied.
from tests.service.conftest import client, make_settings, settings  # noqa: F401
from tests.service.factories import USER, WORKER, cpu_inventory, recipe
from tests.service.test_served_process import free_port


@dataclass
class World:
    """Ids of real rows: a registered worker, a job it runs (with its attempt), and a cancelled job."""

    worker_id: int
    job_id: int
    attempt_id: int
    finished_job_id: int
    # Worker A holds the attempt; worker B is another registered worker (each with its own token).
    worker_a: dict[str, str] = field(default_factory=dict)
    worker_b: dict[str, str] = field(default_factory=dict)


@contextmanager
def served(settings: Settings) -> Iterator[str]:
    """A real uvicorn on 127.0.0.1 in a thread of this process; yields its base URL, stops on exit."""
    port = free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


_WORLDS = itertools.count()


def build_world(client: httpx.Client) -> World:
    """Submit two jobs, cancel the second while queued, and let one CPU worker claim the first."""
    # Fresh names per world: a live worker's name cannot be registered again with the enrolment token.
    serial = next(_WORLDS)
    body = {"name": f"cpu-a{serial}", "inventory": cpu_inventory()}
    registered = client.post("/workers", json=body, headers=WORKER)
    assert registered.status_code == 201, registered.text
    worker_id = int(registered.json()["id"])
    worker_a = {"Authorization": f"Bearer {registered.json()['token']}"}
    other = client.post(
        "/workers", json={"name": f"cpu-b{serial}", "inventory": cpu_inventory()}, headers=WORKER
    )
    worker_b = {"Authorization": f"Bearer {other.json()['token']}"}
    submitted = client.post("/jobs", json=recipe(name="running"), headers=USER)
    assert submitted.status_code == 201, submitted.text
    job_id = int(submitted.json()["id"])
    finished = client.post("/jobs", json=recipe(name="finished"), headers=USER)
    assert finished.status_code == 201, finished.text
    finished_job_id = int(finished.json()["id"])
    cancelled = client.post(f"/jobs/{finished_job_id}/cancel", headers=USER)
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled", cancelled.text
    claimed = client.post(f"/workers/{worker_id}/claim", json={}, headers=worker_a)
    assert claimed.status_code == 200, claimed.text
    attempt = claimed.json()["attempt"]
    assert attempt["job_id"] == job_id
    return World(worker_id, job_id, int(attempt["id"]), finished_job_id, worker_a, worker_b)


@pytest.fixture
def world(client: TestClient) -> World:
    return build_world(client)
