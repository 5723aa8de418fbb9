"""A worker offering several nodes (a Slurm partition) claims a job of several nodes whole, as one attempt
its scheduler places; through the real API, on both databases. The own agents' gang (test_gangs.py)
is unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flightdeck.service.api.app import create_app
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER, as_worker, cpu_inventory, enrolled, recipe
from tests.service.test_gangs import _claim, _finish, _job, _single, _submit, _worker


@pytest.fixture
def client(tmp_path: Path, database_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(tmp_path / "data", database_url_override=database_url))) as test:
        yield test


def _partition(client: TestClient, nodes: int) -> int:
    """What `flightdeck worker --executor slurm` registers: one worker, the partition's nodes."""
    inventory = cpu_inventory(slots=2) | {"address": "", "hostname": "slurm-debug@login", "nodes": nodes}
    answer = client.post("/workers", json={"name": "slurm-debug", "inventory": inventory}, headers=WORKER)
    assert answer.status_code == 201, answer.text
    return enrolled(answer)


def _env(plan: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v["value"] for v in plan["env"]}


def test_a_worker_offering_two_nodes_claims_a_two_node_job_whole_as_one_attempt(client: TestClient) -> None:
    job_id = _submit(client, nodes=2)
    attempt = _claim(client, _partition(client, nodes=2))
    assert attempt is not None and attempt["job_id"] == job_id and "node" not in attempt
    plan = attempt["plan"]
    assert plan["nnodes"] == 2 and plan["argv"][plan["argv"].index("--nnodes") + 1] == "2"
    # One plan for every node: where node 0 is and which node this is are the allocation's to say.
    assert "--node-rank" not in plan["argv"] and "--master-addr" not in plan["argv"]
    env = _env(plan)
    for name in ("MASTER_ADDR", "PET_MASTER_ADDR", "PET_NODE_RANK", "PET_LOCAL_ADDR", "GLOO_SOCKET_IFNAME"):
        assert name in env and env[name] is None, name
    job = _job(client, job_id)
    # Both nodes are the partition worker's (no gang of hosts): its scheduler says which node is which.
    nodes = job["attempts"][0]["nodes"]
    assert job["status"] == "running"
    assert [(n["node_rank"], n["worker_name"], n["status"]) for n in nodes] == [
        (0, "slurm-debug", "running"),
        (1, "slurm-debug", "running"),
    ]


def test_a_partition_smaller_than_the_job_leaves_it_queued_and_joins_no_gang(client: TestClient) -> None:
    big = _submit(client, nodes=3)
    partition = _partition(client, nodes=2)
    assert _claim(client, partition) is None
    # Not even with two own agents alive beside it (enough live workers for a gang of three).
    for name, address in (("w0", "10.0.0.1"), ("w1", "10.0.0.2")):
        _worker(client, name, address)
    assert _claim(client, partition) is None
    assert _job(client, big)["status"] == "queued"
    # It waits in no gang either: a single-node job behind the big one is its next claim at once.
    single = _single(client)
    claimed = _claim(client, partition)
    assert claimed is not None and claimed["job_id"] == single
    assert _job(client, big)["status"] == "queued"


def test_a_partition_with_one_node_free_is_given_the_one_node_job_behind_a_two_node_one(
    client: TestClient,
) -> None:
    """The executor claims with how many nodes it has free (worker/agent/free_capacity.py): a job of
    more waits in Flightdeck's queue, not held by the worker in Slurm's, and the job behind it runs."""
    big = _submit(client, nodes=2)
    single = _single(client)
    partition = _partition(client, nodes=2)

    def claim(body: dict[str, Any]) -> Any:
        return client.post(f"/workers/{partition}/claim?wait=0", json=body, headers=as_worker(partition))

    answer = claim({"devices": [0, 1], "nodes": 1})
    assert answer.status_code == 200 and answer.json()["attempt"]["job_id"] == single, answer.text
    assert _job(client, big)["status"] == "queued"
    assert claim({"devices": [0, 1], "nodes": 1}).status_code == 204
    answer = claim({"devices": [0, 1], "nodes": 2})
    assert answer.status_code == 200 and answer.json()["attempt"]["job_id"] == big, answer.text
    refused = claim({"devices": [0, 1], "nodes": 0})
    assert refused.status_code == 422 and "nodes" in refused.text, refused.text


def test_a_node_failure_or_a_preemption_requeues_the_job_while_attempts_remain(client: TestClient) -> None:
    body = recipe(name="two", resources={"nodes": 2, "gpus_per_node": 1, "accelerator": "cpu"})
    job_id = client.post("/jobs?max_attempts=3", json=body, headers=USER).json()["id"]
    partition = _partition(client, nodes=2)
    for number, cause, then in (
        (1, "node_failure", "queued"),
        (2, "preempted", "queued"),
        (3, "preempted", "failed"),
    ):
        attempt = _claim(client, partition)
        assert attempt is not None and (attempt["job_id"], attempt["number"]) == (job_id, number)
        report = {"status": "failed", "failure_class": cause, "message": "Slurm ended it"}
        assert _finish(client, attempt, partition, **report).json()["job_status"] == then, cause
    # A worker registering no node is refused, naming the field.
    inventory = cpu_inventory() | {"nodes": 0}
    answer = client.post("/workers", json={"name": "none", "inventory": inventory}, headers=WORKER)
    assert answer.status_code == 422 and "nodes" in answer.text, answer.text


def test_each_node_of_a_scheduled_job_ships_its_own_log_as_that_node(client: TestClient) -> None:
    """The executor's one worker holds both nodes; the runner on node 1 names its node, so the two logs
    are two files at their own offsets, not one overwriting the other."""
    job_id = _submit(client, nodes=2)
    token = _partition(client, nodes=2)
    attempt = _claim(client, token)
    assert attempt is not None
    url = f"/attempts/{attempt['id']}/logs"
    headers = as_worker(token)
    for node, text in ((None, "node zero\n"), (1, "node one!\n")):
        answer = client.post(url, json={"offset": 0, "text": text, "node": node}, headers=headers)
        assert answer.status_code == 200, answer.text
    logs = {
        n: client.get(f"/jobs/{job_id}/logs", params={"node": n}, headers=USER).json()["text"] for n in (0, 1)
    }
    assert logs == {0: "node zero\n", 1: "node one!\n"}
    # A node the worker does not hold is refused as a missing attempt, like every attempt route.
    refused = client.post(url, json={"offset": 0, "text": "x\n", "node": 2}, headers=headers)
    assert refused.status_code == 404, refused.text
