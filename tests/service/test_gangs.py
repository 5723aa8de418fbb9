"""Multi-node jobs through the real API, on both databases: gangs gather, fill, release, start together
and end as one attempt with the node that caused the end named."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from flightdeck.service.api.app import create_app
from flightdeck.service.core.config import Settings
from flightdeck.service.leases import reap_expired_leases
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER, as_worker, cpu_inventory, enrolled, recipe

# Long enough that a loaded machine never releases a member between two claims of one test; the release
# test makes its own service with a short wait.
GANG_WAIT = 10.0
SHORT_GANG_WAIT = 1.0


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return make_settings(tmp_path / "data", database_url_override=database_url, gang_wait_seconds=GANG_WAIT)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _worker(client: TestClient, name: str, address: str, hostname: str = "cpu-host") -> int:
    inventory = cpu_inventory(slots=1) | {"address": address, "hostname": hostname}
    answer = client.post("/workers", json={"name": name, "inventory": inventory}, headers=WORKER)
    assert answer.status_code == 201, answer.text
    return enrolled(answer)


def _submit(client: TestClient, nodes: int = 2, **overrides: Any) -> int:
    body = recipe(name=f"gang-{nodes}", resources={"nodes": nodes, "gpus_per_node": 1, "accelerator": "cpu"})
    answer = client.post("/jobs?priority=5", json=body | overrides, headers=USER)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def _single(client: TestClient) -> int:
    body = recipe(name="single", resources={"gpus_per_node": 1, "accelerator": "cpu"})
    answer = client.post("/jobs", json=body, headers=USER)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def _claim(client: TestClient, worker_id: int) -> dict[str, Any] | None:
    answer = client.post(f"/workers/{worker_id}/claim?wait=0", headers=as_worker(worker_id))
    assert answer.status_code in (200, 204), answer.text
    return answer.json()["attempt"] if answer.status_code == 200 else None


def _job(client: TestClient, job_id: int) -> dict[str, Any]:
    return client.get(f"/jobs/{job_id}", headers=USER).json()  # type: ignore[no-any-return]


def _gang(client: TestClient) -> tuple[int, int, int, dict[str, Any], dict[str, Any]]:
    """A filled two-node gang: (job, worker of node 0, worker of node 1, node 0's claim, node 1's)."""
    job = _submit(client)
    first, second = _worker(client, "w0", "10.0.0.1"), _worker(client, "w1", "10.0.0.2")
    assert _claim(client, first) is None  # joined; the gang is not full
    node1 = _claim(client, second)
    node0 = _claim(client, first)
    assert node0 is not None and node1 is not None
    return job, first, second, node0, node1


def _ready(client: TestClient, attempt: dict[str, Any], worker: int, port: int | None = None) -> Any:
    rank = attempt["node"]["rank"]
    return client.post(
        f"/attempts/{attempt['id']}/nodes/{rank}/ready", json={"port": port}, headers=as_worker(worker)
    )


def _finish(client: TestClient, attempt: dict[str, Any], worker: int, **report: Any) -> Any:
    return client.post(f"/attempts/{attempt['id']}/finish", json=report, headers=as_worker(worker))


def _beat(client: TestClient, attempt: dict[str, Any], worker: int) -> list[int]:
    answer = client.post(
        f"/workers/{worker}/heartbeat", json={"attempts": [attempt["id"]]}, headers=as_worker(worker)
    )
    return answer.json()["cancel"]  # type: ignore[no-any-return]


def test_a_two_node_job_starts_as_one_attempt_when_two_workers_joined(client: TestClient) -> None:
    job, first, second, node0, node1 = _gang(client)
    assert node0["id"] == node1["id"]  # one attempt, two nodes
    # When the attempt was made, the same for each node (node 1 filled the gang, node 0 was delivered it).
    assert node0["claimed_at"] == node1["claimed_at"] and isinstance(node0["claimed_at"], float)
    assert (node0["node"]["rank"], node1["node"]["rank"]) == (0, 1)  # ranks in join order
    assert node0["node"]["master_addr"] == node1["node"]["master_addr"] == "10.0.0.1"
    for attempt, rank in ((node0, 0), (node1, 1)):
        argv = attempt["plan"]["argv"]
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.1"
    detail = _job(client, job)
    assert detail["status"] == "running" and len(detail["attempts"]) == 1
    nodes = detail["attempts"][0]["nodes"]
    assert [(n["node_rank"], n["worker_name"], n["address"], n["status"]) for n in nodes] == [
        (0, "w0", "10.0.0.1", "running"),
        (1, "w1", "10.0.0.2", "running"),
    ]
    # Each member runs the attempt, node 1's worker too (it holds a node, not the attempt's worker_id).
    listed = {w["name"]: w["running_attempts"] for w in client.get("/workers", headers=USER).json()}
    assert listed == {"w0": [node0["id"]], "w1": [node0["id"]]}
    # Each node is claimed once: later claims of either worker find nothing.
    assert _claim(client, first) is None and _claim(client, second) is None


def test_no_node_starts_until_every_node_is_ready_and_node_zero_gave_its_port(client: TestClient) -> None:
    _, first, second, node0, node1 = _gang(client)
    waiting = _ready(client, node1, second).json()
    assert waiting["start"] is False and waiting["waiting_for"] == [0]
    assert _ready(client, node0, first).status_code == 422  # node 0 must report its port
    # A worker speaks only for its own node.
    assert (
        client.post(
            f"/attempts/{node0['id']}/nodes/0/ready", json={"port": 1}, headers=as_worker(second)
        ).status_code
        == 403
    )
    go = _ready(client, node0, first, port=29555).json()
    assert go["start"] is True and go["master_port"] == 29555 and go["master_addr"] == "10.0.0.1"
    assert _ready(client, node1, second).json()["start"] is True


def test_a_node_waiting_at_the_barrier_starts_the_moment_the_last_node_is_ready(client: TestClient) -> None:
    _, first, second, node0, node1 = _gang(client)
    answers: list[tuple[float, Any]] = []

    def wait_for_node_zero() -> None:
        url = f"/attempts/{node1['id']}/nodes/1/ready?wait=20"
        answer = client.post(url, json={"port": None}, headers=as_worker(second))
        answers.append((time.monotonic(), answer.json()))

    waiter = threading.Thread(target=wait_for_node_zero)
    waiter.start()
    time.sleep(0.5)
    assert not answers  # still waiting: node 0 has not reported
    reported = time.monotonic()
    assert _ready(client, node0, first, port=29555).json()["start"] is True
    waiter.join(20)
    [(answered, body)] = answers
    assert body["start"] is True and body["master_port"] == 29555
    assert answered - reported < 2.0  # woken by node 0's report, not by the 20 s wait


def test_the_attempt_succeeds_when_every_node_has_and_each_nodes_log_is_kept(client: TestClient) -> None:
    job, first, second, node0, node1 = _gang(client)
    for attempt, worker, line in ((node0, first, "node zero\n"), (node1, second, "node one\n")):
        chunk = {"offset": 0, "text": line, "length": len(line)}
        logged = client.post(f"/attempts/{attempt['id']}/logs", json=chunk, headers=as_worker(worker))
        assert logged.status_code == 200, logged.text
    assert client.get(f"/jobs/{job}/logs", headers=USER).json()["text"] == "node zero\n"
    assert client.get(f"/jobs/{job}/logs?node=1", headers=USER).json()["text"] == "node one\n"
    assert _finish(client, node1, second, status="succeeded", exit_code=0).json()["job_status"] == "running"
    assert _finish(client, node0, first, status="succeeded", exit_code=0).json()["job_status"] == "succeeded"
    assert _finish(client, node1, second, status="succeeded", exit_code=0).status_code == 200  # a repeat


def test_a_failed_node_stops_the_others_and_the_job_fails_with_that_node_named(client: TestClient) -> None:
    job, first, second, node0, node1 = _gang(client)
    assert _beat(client, node0, first) == []
    failed = _finish(
        client,
        node1,
        second,
        status="failed",
        exit_code=1,
        failure_class="exit:1",
        failure_code="D001",
        message="no rows had the fields",
    )
    assert failed.json()["job_status"] == "running"  # until node 0 confirms its ranks are gone
    assert _beat(client, node0, first) == [node0["id"]]  # node 0 is told to stop
    assert _ready(client, node0, first, port=1).json()["abort"] == "node 1 (w1) failed"
    _finish(
        client, node0, first, status="cancelled", failure_class="cancelled", message="asked by the service"
    )
    detail = _job(client, job)
    assert detail["status"] == "failed" and detail["failure_code"] == "D001"
    assert detail["failure_message"] == "node 1 (w1): no rows had the fields"
    assert [n["status"] for n in detail["attempts"][0]["nodes"]] == ["cancelled", "failed"]


def test_a_node_whose_lease_ran_out_requeues_the_job_as_one_attempt(
    client: TestClient, settings: Settings
) -> None:
    job, first, second, node0, _ = _gang(client)
    db = client.app.state.flightdeck.db  # type: ignore[attr-defined]
    with db.writing() as conn:  # node 1's agent died: its lease is in the past
        conn.execute(text("UPDATE attempt_nodes SET lease_expires_at = 1 WHERE node_rank = 1"))
    reap_expired_leases(db)
    assert _beat(client, node0, first) == [node0["id"]]
    assert _job(client, job)["status"] == "running"  # node 0's ranks may still be alive
    _finish(client, node0, first, status="cancelled", failure_class="cancelled")
    detail = _job(client, job)
    assert detail["status"] == "queued" and detail["attempt_count"] == 1
    attempt = detail["attempts"][0]
    assert attempt["status"] == "lost" and attempt["message"].startswith("node 1 (w1): no heartbeat")
    # The retry's gang: both nodes (one filled it, one was delivered it) say when the job first started.
    assert _claim(client, first) is None
    retry1 = _claim(client, second)
    retry0 = _claim(client, first)
    assert retry0 is not None and retry1 is not None and retry0["number"] == 2
    assert retry0["job_started_at"] == retry1["job_started_at"] == node0["claimed_at"] < retry0["claimed_at"]


def test_revoking_a_worker_loses_its_node_at_once_and_stops_the_other_node(client: TestClient) -> None:
    job, first, second, node0, _ = _gang(client)
    revoked = client.post(f"/workers/{second}/revoke", headers=USER)
    assert revoked.status_code == 200, revoked.text
    # The revoke reaps at once: node 1 is lost without waiting for its lease, node 0 is told to stop.
    nodes = _job(client, job)["attempts"][0]["nodes"]
    assert [n["status"] for n in nodes] == ["running", "lost"]
    assert _beat(client, node0, first) == [node0["id"]]


def test_cancel_is_confirmed_only_when_every_node_stopped(client: TestClient) -> None:
    job, first, second, node0, node1 = _gang(client)
    assert client.post(f"/jobs/{job}/cancel", headers=USER).json()["status"] == "cancelling"
    assert _beat(client, node0, first) == [node0["id"]] and _beat(client, node1, second) == [node1["id"]]
    _finish(client, node0, first, status="cancelled", failure_class="cancelled")
    assert _job(client, job)["status"] == "cancelling"
    _finish(client, node1, second, status="cancelled", failure_class="cancelled")
    assert _job(client, job)["status"] == "cancelled"


def test_a_gang_that_cannot_fill_lets_the_single_node_job_behind_it_run(client: TestClient) -> None:
    gang = _submit(client)
    single = _single(client)
    alone = _worker(client, "alone", "10.0.0.1")
    assert "a gang of 2 workers is needed and 1 live worker fits" in _job(client, gang)["waiting"]
    claimed = _claim(client, alone)
    assert claimed is not None and claimed["job_id"] == single  # priority 5 gang skipped: nobody to fill it
    assert _job(client, gang)["status"] == "queued"


def test_a_worker_waiting_in_a_gang_is_released_after_the_gang_wait(settings: Settings) -> None:
    with TestClient(create_app(settings.model_copy(update={"gang_wait_seconds": SHORT_GANG_WAIT}))) as client:
        _released_after_the_wait(client)


def _released_after_the_wait(client: TestClient) -> None:
    gang = _submit(client)
    single = _single(client)
    first, _ = _worker(client, "w0", "10.0.0.1"), _worker(client, "w1", "10.0.0.2")  # w1 never claims
    assert _claim(client, first) is None  # waits in the gang...
    assert _claim(client, first) is None  # ...and takes nothing else meanwhile
    time.sleep(SHORT_GANG_WAIT + 0.1)
    claimed = _claim(client, first)
    assert claimed is not None and claimed["job_id"] == single  # released: the job behind it runs
    assert _job(client, gang)["status"] == "queued"
    # The timeline says why the gang still waits: its member was let go.
    events = client.get(f"/jobs/{gang}/events", headers=USER).json()["events"]
    released = [e for e in events if e["kind"] == "node"]
    assert [(e["code"], e["message"], e["data"]["status"]) for e in released] == [
        (
            "N002",
            "w0 left the job's gang, which did not fill in time; it takes other jobs meanwhile",
            "released",
        )
    ]
    assert "FLIGHTDECK_GANG_WAIT_SECONDS" in released[0]["fix"]


def test_a_multi_stage_recipe_cannot_run_on_several_nodes(client: TestClient) -> None:
    body = recipe(
        name="staged",
        resources={"nodes": 2, "gpus_per_node": 1, "accelerator": "cpu"},
        stages=[{"name": "one"}, {"name": "two"}],
    )
    answer = client.post("/jobs", json=body, headers=USER)
    assert answer.status_code == 422
    assert "resources.nodes" in answer.text and "multi-stage" in answer.text


def test_a_gang_over_hosts_meets_at_the_member_the_others_can_reach(client: TestClient) -> None:
    # N001: a loopback address is only reachable from its own host.
    _submit(client)
    local, routable = (
        _worker(client, "w0", "127.0.0.1", "host-a"),
        _worker(client, "w1", "10.0.0.2", "host-b"),
    )
    assert _claim(client, local) is None
    assert _claim(client, routable)["node"] == {"rank": 0, "nnodes": 2, "master_addr": "10.0.0.2"}  # type: ignore[index]
    assert _claim(client, local)["node"]["rank"] == 1  # type: ignore[index]


def test_a_gang_over_hosts_that_cannot_reach_each_other_fails_with_n001(client: TestClient) -> None:
    job = _submit(client)
    first, second = _worker(client, "w0", "127.0.0.1", "host-a"), _worker(client, "w1", "127.0.1.1", "host-b")
    assert _claim(client, first) is None and _claim(client, second) is None
    detail = _job(client, job)
    assert (detail["status"], detail["failure_code"]) == ("failed", "N001")
    assert "--address" in detail["failure_fix"] and "host-b: 127.0.1.1" in detail["failure_message"]
    assert detail["attempts"] == []
