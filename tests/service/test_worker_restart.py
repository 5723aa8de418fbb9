"""A restarted worker whose attempts outlive it (a Slurm executor): it registers as itself, keeps its
token (its jobs' runners hold it), keeps the attempts the service still runs on it and is told to stop
the others."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from sqlmodel import select

from flightdeck.service.models import AttemptNode
from tests.service.factories import USER, WORKER, as_worker, cpu_inventory, enrolled
from tests.service.test_worker_api import claim, submit


def _lease(client: TestClient, attempt_id: int) -> float:
    """The attempt's lease: its node 0's (the nodes hold the leases)."""
    with client.app.state.flightdeck.db.read() as session:  # type: ignore[attr-defined]
        node = session.exec(
            select(AttemptNode).where(AttemptNode.attempt_id == attempt_id, AttemptNode.node_rank == 0)
        ).one()
        return float(node.lease_expires_at or 0)


def _restart(client: TestClient, worker_id: int, held: list[int], headers: dict[str, str]) -> dict:  # type: ignore[type-arg]
    answer = client.post(
        "/workers",
        json={"name": "slurm-a", "inventory": cpu_inventory(4), "keep_token": True, "held": held},
        headers=headers,
    )
    assert answer.status_code == 201, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_a_restarted_worker_keeps_its_token_and_the_attempts_it_still_runs(client: TestClient) -> None:
    worker_id = enrolled(
        client.post("/workers", json={"name": "slurm-a", "inventory": cpu_inventory(4)}, headers=WORKER)
    )
    own = as_worker(worker_id)
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    attempt_id = int(attempt["id"])  # type: ignore[call-overload]
    before = _lease(client, attempt_id)
    time.sleep(0.05)
    answer = _restart(client, worker_id, [attempt_id], own)
    assert (answer["id"], answer["stop"]) == (worker_id, [])
    # The same token: what the jobs' runners send goes on being accepted.
    assert answer["token"] == own["Authorization"].removeprefix("Bearer ")
    assert client.post(f"/workers/{worker_id}/heartbeat", json={}, headers=own).status_code == 200
    # A full lease from the registration on, before any heartbeat.
    assert _lease(client, attempt_id) > before


def test_held_attempts_the_service_no_longer_runs_there_are_named_to_stop(client: TestClient) -> None:
    worker_id = enrolled(
        client.post("/workers", json={"name": "slurm-a", "inventory": cpu_inventory(4)}, headers=WORKER)
    )
    other = enrolled(
        client.post("/workers", json={"name": "host-b", "inventory": cpu_inventory(4)}, headers=WORKER)
    )
    ended_job = submit(client)
    ended = claim(client, worker_id)
    assert ended is not None
    assert client.post(f"/jobs/{ended_job}/cancel", headers=USER).status_code == 202
    finish = client.post(
        f"/attempts/{ended['id']}/finish",
        json={"status": "cancelled", "failure_class": "cancelled", "message": "cancelled"},
        headers=as_worker(worker_id),
    )
    assert finish.status_code == 200, finish.text
    submit(client)
    others = claim(client, other)
    assert others is not None
    held = [int(ended["id"]), int(others["id"]), 10_000]  # type: ignore[call-overload]
    answer = _restart(client, worker_id, held, as_worker(worker_id))
    assert answer["stop"] == sorted(held)
    # Another worker's attempt keeps its lease: only the holder renews it.
    assert client.get(f"/jobs/{others['job_id']}", headers=USER).json()["status"] == "running"


def test_a_worker_that_had_to_enrol_again_stops_every_attempt_it_held(client: TestClient) -> None:
    worker_id = enrolled(
        client.post("/workers", json={"name": "slurm-a", "inventory": cpu_inventory(4)}, headers=WORKER)
    )
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    revoked = client.post(f"/workers/{worker_id}/revoke", headers=USER)
    assert revoked.status_code == 200, revoked.text
    # Its own token is gone: the executor enrols, and keeps none of what it held.
    answer = _restart(client, worker_id, [int(attempt["id"])], WORKER)  # type: ignore[call-overload]
    assert answer["stop"] == [attempt["id"]]
    assert answer["token"] != WORKER["Authorization"].removeprefix("Bearer ")
