"""Revocation holds everywhere: a waiting claim of a revoked worker gets nothing, and two service
processes on one database agree on every worker token at once (each call reads the database)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from flightdeck.service.core.config import Settings
from tests.reliability.conftest import served
from tests.service.factories import USER, WORKER, cpu_inventory, recipe
from tests.service.test_served_process import free_port, start_service


def _register(api: httpx.Client, name: str) -> tuple[int, dict[str, str]]:
    answer = api.post("/workers", json={"name": name, "inventory": cpu_inventory()}, headers=WORKER)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"]), {"Authorization": f"Bearer {answer.json()['token']}"}


def test_a_revoked_workers_waiting_claim_gets_nothing_and_the_job_stays_queued(settings: Settings) -> None:
    with served(settings) as url, httpx.Client(base_url=url, timeout=30) as api:
        worker_id, own = _register(api, "doomed")
        answers: list[httpx.Response] = []
        waiting = threading.Thread(
            target=lambda: answers.append(
                api.post(f"/workers/{worker_id}/claim?wait=15", json={}, headers=own)
            )
        )
        waiting.start()
        time.sleep(1.0)  # the claim is long-polling now
        revoked_at = time.monotonic()
        assert api.post(f"/workers/{worker_id}/revoke", headers=USER).status_code == 200
        submitted = api.post("/jobs", json=recipe(name="after-revoke"), headers=USER)
        assert submitted.status_code == 201, submitted.text
        waiting.join(20)
        # Ended by the revocation itself, well before its 15 s wait ran out, and with nothing in it.
        assert answers and answers[0].status_code == 204, answers and answers[0].text
        assert time.monotonic() - revoked_at < 5
        job = api.get(f"/jobs/{submitted.json()['id']}", headers=USER).json()
        assert job["status"] == "queued" and job["attempts"] == [], job
        # Every later call with the revoked token is refused.
        assert api.post(f"/workers/{worker_id}/claim", json={}, headers=own).status_code == 401
        assert api.post(f"/workers/{worker_id}/heartbeat", json={}, headers=own).status_code == 401


def test_a_claim_racing_a_revocation_is_refused_in_its_own_transaction(settings: Settings) -> None:
    """The claim checks the worker's token inside the transaction that picks the job: a revocation
    between the request's authentication and the claim hands it nothing."""
    from flightdeck.inventory import WorkerInventory
    from flightdeck.service.claims import ClaimOrder, RevokedWorker, claim_next_job
    from flightdeck.service.core.auth import digest
    from flightdeck.service.core.db import Database, migrate
    from flightdeck.service.jobs import submit_job
    from flightdeck.service.registration import register_worker, revoke_worker

    migrate(settings.database_url)
    db = Database(settings.database_url)
    try:
        worker, token = register_worker(
            db, "racer", WorkerInventory.model_validate(cpu_inventory()), caller=None, lease_seconds=60
        )
        assert worker.id is not None
        submit_job(db, recipe(name="raced"))
        order = ClaimOrder(worker.id, None, digest(token))  # authenticated a moment ago
        revoke_worker(db, worker.id)
        with pytest.raises(RevokedWorker):
            claim_next_job(db, order, lease_seconds=60)
        # Registered again, the worker has a new token: a claim that came with the old one still gets nothing.
        again, _ = register_worker(
            db, "racer", WorkerInventory.model_validate(cpu_inventory()), caller=None, lease_seconds=60
        )
        assert again.id == worker.id
        with pytest.raises(RevokedWorker):
            claim_next_job(db, order, lease_seconds=60)
    finally:
        db.close()


@pytest.mark.slow  # two real service processes per database
def test_two_service_processes_on_one_database_agree_on_worker_tokens(
    tmp_path: Path, database_url: str
) -> None:
    """Register on A, use the token on B, revoke on A: B refuses it at once; a worker registered on A
    after B served is accepted by B (on SQLite the two processes share one file)."""
    ports = free_port(), free_port()
    processes = [start_service(tmp_path / f"data-{i}", port, database_url) for i, port in enumerate(ports)]
    a = httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}", timeout=30)
    b = httpx.Client(base_url=f"http://127.0.0.1:{ports[1]}", timeout=30)
    try:
        worker_id, own = _register(a, "shared-1")
        assert b.post(f"/workers/{worker_id}/heartbeat", json={}, headers=own).status_code == 200
        assert b.post(f"/workers/{worker_id}/claim", json={}, headers=own).status_code == 204
        assert a.post(f"/workers/{worker_id}/revoke", headers=USER).status_code == 200
        assert b.post(f"/workers/{worker_id}/heartbeat", json={}, headers=own).status_code == 401
        assert b.post(f"/workers/{worker_id}/claim", json={}, headers=own).status_code == 401
        later_id, later = _register(a, "shared-2")
        assert b.post(f"/workers/{later_id}/heartbeat", json={}, headers=later).status_code == 200
    finally:
        a.close()
        b.close()
        for process in processes:
            process.terminate()
            process.wait(15)
