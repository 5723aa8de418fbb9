"""Leases expire by the service's own reaper; concurrent claims never share a job."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flightdeck.service.api.app import create_app
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER, as_worker, cpu_inventory, enrolled, recipe


@pytest.fixture
def short_lease_client(tmp_path: Path) -> Iterator[TestClient]:
    # 1.2 s: short enough that a test outlives it several times, long enough that one slow request on a
    # busy 2-core CI machine (a 0.6 s lease once ran out between two heartbeats) is not a lost lease.
    settings = make_settings(tmp_path / "data", lease_seconds=1.2, reaper_interval_seconds=0.1)
    with TestClient(create_app(settings)) as client:
        yield client


def _job(client: TestClient, job_id: int) -> dict[str, object]:
    detail: dict[str, object] = client.get(f"/jobs/{job_id}", headers=USER).json()
    return detail


def _wait_for(client: TestClient, job_id: int, status: str, timeout: float = 10) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = _job(client, job_id)
        if job["status"] == status:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} is {_job(client, job_id)['status']}, not {status}")


def test_expired_lease_requeues_then_fails_lease_lost(short_lease_client: TestClient) -> None:
    client = short_lease_client
    job_id = client.post("/jobs?max_attempts=2", json=recipe(), headers=USER).json()["id"]
    wid = enrolled(client.post("/workers", json={"name": "w", "inventory": cpu_inventory()}, headers=WORKER))
    first = client.post(f"/workers/{wid}/claim", json={}, headers=as_worker(wid)).json()["attempt"]
    points = {"points": [{"step": 7, "values": {"loss": 1.5}}]}
    client.post(f"/attempts/{first['id']}/metrics", json=points, headers=as_worker(wid))
    assert _job(client, job_id)["last_step"] == 7
    # Nobody calls the API now: the service must notice the silent worker on its own.
    _wait_for(client, job_id, "queued")
    second = client.post(f"/workers/{wid}/claim", json={}, headers=as_worker(wid)).json()["attempt"]
    assert second["job_id"] == job_id and second["number"] == 2
    # Progress belongs to the attempt: the new one starts from nothing.
    assert _job(client, job_id)["last_step"] is None and _job(client, job_id)["last_loss"] is None
    job = _wait_for(client, job_id, "failed")
    assert job["failure_class"] == "lease_lost"
    assert [a["status"] for a in job["attempts"]] == ["lost", "lost"]  # type: ignore[union-attr]
    beat = client.post(f"/workers/{wid}/heartbeat", json={"attempts": [first["id"]]}, headers=as_worker(wid))
    assert beat.json()["cancel"] == [first["id"]]


def test_heartbeats_keep_the_lease(short_lease_client: TestClient) -> None:
    client = short_lease_client
    job_id = client.post("/jobs", json=recipe(), headers=USER).json()["id"]
    wid = enrolled(client.post("/workers", json={"name": "w", "inventory": cpu_inventory()}, headers=WORKER))
    attempt = client.post(f"/workers/{wid}/claim", json={}, headers=as_worker(wid)).json()["attempt"]
    for _ in range(30):  # 3 s: the lease would have run out twice without the heartbeats
        client.post(f"/workers/{wid}/heartbeat", json={"attempts": [attempt["id"]]}, headers=as_worker(wid))
        time.sleep(0.1)
    assert _job(client, job_id)["status"] == "running"


def test_cancelling_job_with_a_lost_lease_ends_cancelled(short_lease_client: TestClient) -> None:
    client = short_lease_client
    job_id = client.post("/jobs", json=recipe(), headers=USER).json()["id"]
    wid = enrolled(client.post("/workers", json={"name": "w", "inventory": cpu_inventory()}, headers=WORKER))
    client.post(f"/workers/{wid}/claim", json={}, headers=as_worker(wid))
    client.post(f"/jobs/{job_id}/cancel", headers=USER)
    _wait_for(client, job_id, "cancelled")


def test_concurrent_claims_take_each_job_exactly_once(client: TestClient) -> None:
    jobs = 40
    for i in range(jobs):
        client.post("/jobs", json=recipe(name=f"j{i}"), headers=USER)
    worker_ids = [
        enrolled(
            client.post("/workers", json={"name": f"w{i}", "inventory": cpu_inventory()}, headers=WORKER)
        )
        for i in range(8)
    ]
    claimed: list[int] = []
    lock = threading.Lock()

    def drain(worker_id: int) -> None:
        while True:
            answer = client.post(f"/workers/{worker_id}/claim", json={}, headers=as_worker(worker_id))
            if answer.status_code == 204:
                return
            with lock:
                claimed.append(answer.json()["attempt"]["job_id"])

    threads = [threading.Thread(target=drain, args=(w,)) for w in worker_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    counts = Counter(claimed)
    assert len(counts) == jobs and set(counts.values()) == {1}
    assert client.get("/jobs?status=running&limit=500", headers=USER).json()["count"] == jobs
