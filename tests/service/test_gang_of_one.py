"""Every attempt is a gang: a single-node claim is node 0, held by its claimer, and a worker whose
scheduler places N nodes holds all N; the nodes hold the only leases. Through the real API, on both
databases."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import text

from flightdeck.service.leases import reap_expired_leases
from tests.service.factories import USER, as_worker
from tests.service.test_gangs import _beat, _claim, _finish, _job, _single, _submit, _worker
from tests.service.test_scheduled_claims import _partition


def _node_leases(client: TestClient, attempt_id: int) -> list[float | None]:
    db = client.app.state.flightdeck.db  # type: ignore[attr-defined]
    with db.reading() as conn:
        query = "SELECT lease_expires_at FROM attempt_nodes WHERE attempt_id = :a ORDER BY node_rank"
        return [row[0] for row in conn.execute(text(query), {"a": attempt_id})]


def _nodes(detail: dict[str, Any]) -> list[tuple[int, str | None, str, list[int]]]:
    return [
        (n["node_rank"], n["worker_name"], n["status"], n["devices"]) for n in detail["attempts"][0]["nodes"]
    ]


def test_a_single_node_claim_is_node_zero_held_by_its_claimer_whose_heartbeat_renews_its_lease(
    client: TestClient,
) -> None:
    job_id = _single(client)
    worker = _worker(client, "solo", "10.0.0.9")
    claimed = _claim(client, worker)
    assert claimed is not None and "node" not in claimed  # the wire answer is unchanged
    detail = _job(client, job_id)
    assert _nodes(detail) == [(0, "solo", "running", [0])]
    [lease] = _node_leases(client, claimed["id"])
    assert lease is not None and detail["attempts"][0]["lease_expires_at"] == lease
    time.sleep(0.05)
    assert _beat(client, claimed, worker) == []
    [renewed] = _node_leases(client, claimed["id"])
    assert renewed is not None and renewed > lease
    assert _finish(client, claimed, worker, status="succeeded").json()["job_status"] == "succeeded"
    detail = _job(client, job_id)
    assert (
        _nodes(detail) == [(0, "solo", "succeeded", [0])]
        and detail["attempts"][0]["lease_expires_at"] is None
    )


def test_a_single_node_attempt_whose_node_lease_ran_out_is_lost_with_the_plain_message(
    client: TestClient,
) -> None:
    job_id = _single(client)
    worker = _worker(client, "solo", "10.0.0.9")
    claimed = _claim(client, worker)
    assert claimed is not None
    db = client.app.state.flightdeck.db  # type: ignore[attr-defined]
    assert reap_expired_leases(db, time.time() + 3600) == [job_id]
    detail = _job(client, job_id)
    attempt = detail["attempts"][0]
    assert detail["status"] == "queued" and attempt["status"] == "lost"
    # One worker's attempt keeps its report as it is: no "node 0 (solo): " before it.
    assert attempt["message"] == "no heartbeat from the worker before the lease expired"
    assert _nodes(detail) == [(0, "solo", "lost", [0])]
    # The timeline: the node lost (naming its worker), the attempt's end, then the job's change as before.
    events = client.get(f"/jobs/{job_id}/events", headers=USER).json()["events"]
    assert [(e["kind"], e["severity"], e["message"]) for e in events[2:]] == [
        ("node", "warn", "node 0 (solo) lost: no heartbeat from the worker before the lease expired"),
        ("attempt", "warn", "attempt 1 lost: no heartbeat from the worker before the lease expired"),
        ("status", "info", "requeued after lease_lost"),
    ]
    # The agent coming back is told to stop, and its late report changes nothing.
    assert _beat(client, claimed, worker) == [claimed["id"]]
    late = _finish(client, claimed, worker, status="failed", failure_class="exit:1")
    assert late.status_code == 409 and late.json()["detail"]["attempt_status"] == "lost"


def test_a_handed_back_claim_leaves_no_node_behind(client: TestClient) -> None:
    job_id = _single(client)
    worker = _worker(client, "solo", "10.0.0.9")
    claimed = _claim(client, worker)
    assert claimed is not None
    answer = client.post(f"/attempts/{claimed['id']}/release", headers=as_worker(worker))
    assert answer.status_code == 200, answer.text
    assert _node_leases(client, claimed["id"]) == []
    assert _job(client, job_id)["status"] == "queued"
    again = _claim(client, worker)
    assert again is not None and again["number"] == 1
    assert _nodes(_job(client, job_id)) == [(0, "solo", "running", [0])]


def test_a_partitions_heartbeat_renews_all_its_nodes_and_its_report_ends_them_with_its_own_message(
    client: TestClient,
) -> None:
    job_id = _submit(client, nodes=2)
    partition = _partition(client, nodes=2)
    claimed = _claim(client, partition)
    assert claimed is not None
    before = _node_leases(client, claimed["id"])
    time.sleep(0.05)
    assert _beat(client, claimed, partition) == []
    after = _node_leases(client, claimed["id"])
    assert all(b is not None and a is not None and a > b for a, b in zip(after, before, strict=True))
    report = {"status": "failed", "failure_class": "node_failure", "message": "Slurm: node n2 failed"}
    assert _finish(client, claimed, partition, **report).json()["job_status"] == "queued"  # retried
    detail = _job(client, job_id)
    assert [n[2] for n in _nodes(detail)] == ["failed", "failed"]
    assert detail["attempts"][0]["message"] == "Slurm: node n2 failed"
    ended = [
        e
        for e in client.get(f"/jobs/{job_id}/events", headers=USER).json()["events"]
        if e["kind"] == "attempt"
    ]
    assert [(e["severity"], e["message"], e["data"]["failure_class"]) for e in ended] == [
        ("error", "attempt 1 failed (node_failure): Slurm: node n2 failed", "node_failure")
    ]
    # The barrier is a gang of hosts' only: one worker's nodes do not wait for each other.
    ready = client.post(
        f"/attempts/{claimed['id']}/nodes/0/ready", json={"port": 29500}, headers=as_worker(partition)
    )
    assert ready.status_code == 409 and "one worker" in ready.text
    assert client.get(f"/jobs/{job_id}", headers=USER).status_code == 200


def test_a_heartbeat_for_an_attempt_the_worker_holds_no_node_of_stops_it_and_renews_nothing(
    client: TestClient,
) -> None:
    _single(client)
    holder, other = _worker(client, "solo", "10.0.0.9"), _worker(client, "other", "10.0.0.8")
    claimed = _claim(client, holder)
    assert claimed is not None
    before = _node_leases(client, claimed["id"])
    time.sleep(0.05)
    assert _beat(client, claimed, other) == [claimed["id"]]
    assert _node_leases(client, claimed["id"]) == before
    assert _beat(client, claimed, holder) == []
