"""The worker side: register, claim (fit, long-poll), heartbeat, reports, finish."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from tests.service.factories import (
    USER,
    WORKER,
    as_owner,
    as_worker,
    claimed_by,
    cpu_inventory,
    enrolled,
    gpu_inventory,
    recipe,
)


def submit(client: TestClient, **overrides: object) -> int:
    answer = client.post("/jobs", json=recipe(**overrides), headers=USER)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def register(client: TestClient, name: str, inventory: dict[str, object]) -> int:
    return enrolled(client.post("/workers", json={"name": name, "inventory": inventory}, headers=WORKER))


def claim(client: TestClient, worker_id: int, wait: float = 0) -> dict[str, object] | None:
    answer = client.post(f"/workers/{worker_id}/claim?wait={wait}", json={}, headers=as_worker(worker_id))
    if answer.status_code == 204:
        return None
    assert answer.status_code == 200, answer.text
    attempt: dict[str, object] = answer.json()["attempt"]
    return claimed_by(worker_id, attempt)  # type: ignore[no-any-return]


def test_a_revoked_worker_is_not_alive_anywhere_while_its_last_beat_is_within_the_lease(
    client: TestClient,
) -> None:
    revoked = register(client, "revoked-host", cpu_inventory(2))
    assert client.post(f"/workers/{revoked}/revoke", headers=USER).status_code == 200
    job = submit(client, name="after-the-revoke")

    def alive() -> dict[str, bool]:
        return {w["name"]: w["alive"] for w in client.get("/workers", headers=USER).json()}

    def gauge() -> float:
        line = next(
            x for x in client.get("/metrics").text.splitlines() if x.startswith("flightdeck_workers_alive ")
        )
        return float(line.split()[1])

    assert alive() == {"revoked-host": False} and gauge() == 0
    waiting = client.get(f"/jobs/{job}", headers=USER).json()["waiting"]
    assert waiting.startswith("no live worker") and "revoked-host" not in waiting, waiting
    register(client, "other-host", cpu_inventory(2))
    assert alive() == {"other-host": True, "revoked-host": False} and gauge() == 1
    assert "other-host" in client.get(f"/jobs/{job}", headers=USER).json()["waiting"]


def test_a_worker_re_registers_as_itself_and_its_name_cannot_be_taken(client: TestClient) -> None:
    first = register(client, "host-a", cpu_inventory(2))
    old = as_worker(first)
    again = client.post("/workers", json={"name": "host-a", "inventory": cpu_inventory(4)}, headers=old)
    assert again.status_code == 201 and enrolled(again) == first  # the same id, a new token
    assert client.post(f"/workers/{first}/heartbeat", json={}, headers=old).status_code == 401  # rotated
    listed = client.get("/workers", headers=USER).json()
    assert [(w["name"], w["inventory"]["cpu_slots"], w["alive"]) for w in listed] == [("host-a", 4, True)]
    # The enrolment token cannot take a live worker's name; another worker's token cannot either.
    taken = client.post("/workers", json={"name": "host-a", "inventory": cpu_inventory()}, headers=WORKER)
    assert taken.status_code == 409 and "revoke" in taken.json()["detail"]
    other = register(client, "host-b", cpu_inventory())
    stolen = client.post(
        "/workers", json={"name": "host-a", "inventory": cpu_inventory()}, headers=as_worker(other)
    )
    assert stolen.status_code == 403


def test_claim_gives_the_job_with_its_plan_and_stores_the_plan(client: TestClient, worker_id: int) -> None:
    job_id = submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None and attempt["job_id"] == job_id and attempt["number"] == 1
    plan = attempt["plan"]
    assert (
        isinstance(plan, dict) and "flightdeck.worker.train" in plan["argv"] and plan["nproc_per_node"] == 2
    )
    detail = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert detail["status"] == "running" and detail["worker_name"] == "cpu-1"
    assert detail["attempts"][0]["plan"] == plan
    assert claim(client, worker_id) is None


def test_claim_only_takes_jobs_that_fit(client: TestClient) -> None:
    gpu_job = submit(
        client, resources={"gpus_per_node": 2, "accelerator": "gpu"}, training={"precision": "bf16"}
    )
    big_job = submit(
        client, resources={"gpus_per_node": 8, "accelerator": "any"}, training={"precision": "fp32"}
    )
    cpu = register(client, "cpu", cpu_inventory(2))
    assert claim(client, cpu) is None  # a GPU job and an 8-process job
    volta = register(client, "volta", gpu_inventory(4, "Tesla V100-SXM2-32GB", "7.0"))
    assert claim(client, volta) is None  # bf16 needs compute capability 8.0
    ampere = register(client, "ampere", gpu_inventory(8))
    assert claim(client, ampere)["job_id"] == gpu_job  # type: ignore[index]
    assert claim(client, ampere)["job_id"] == big_job  # type: ignore[index]


def test_priority_then_age(client: TestClient, worker_id: int) -> None:
    old = submit(client)
    urgent = client.post("/jobs?priority=5", json=recipe(), headers=USER).json()["id"]
    newer = submit(client)
    order = [claim(client, worker_id)["job_id"] for _ in range(3)]  # type: ignore[index]
    assert order == [urgent, old, newer]


def test_long_poll_wakes_when_a_job_arrives(client: TestClient, worker_id: int) -> None:
    results: list[object] = []
    started = time.monotonic()
    poller = threading.Thread(target=lambda: results.append(claim(client, worker_id, wait=10)))
    poller.start()
    time.sleep(0.3)
    job_id = submit(client)
    poller.join(timeout=10)
    assert results and results[0] is not None and results[0]["job_id"] == job_id  # type: ignore[index]
    assert time.monotonic() - started < 5


def test_long_poll_times_out_with_204(client: TestClient, worker_id: int) -> None:
    started = time.monotonic()
    assert claim(client, worker_id, wait=0.5) is None
    assert 0.4 < time.monotonic() - started < 5


def test_heartbeat_extends_the_lease_and_carries_cancel_orders(client: TestClient, worker_id: int) -> None:
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    beat = client.post(
        f"/workers/{worker_id}/heartbeat", json={"attempts": [attempt["id"]]}, headers=as_worker(worker_id)
    )
    assert beat.json()["cancel"] == []
    client.post(f"/jobs/{attempt['job_id']}/cancel", headers=USER)
    beat = client.post(
        f"/workers/{worker_id}/heartbeat",
        json={"attempts": [attempt["id"], 777]},
        headers=as_worker(worker_id),
    )
    assert beat.json()["cancel"] == [attempt["id"], 777]
    # A worker heartbeats only for itself; the enrolment token only registers.
    assert (
        client.post("/workers/999/heartbeat", json={"attempts": []}, headers=as_worker(worker_id)).status_code
        == 403
    )
    assert client.post(f"/workers/{worker_id}/heartbeat", json={}, headers=WORKER).status_code == 403


def test_metrics_are_idempotent_and_keep_nan(client: TestClient, worker_id: int) -> None:
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    batch = {"points": [{"step": s, "values": {"loss": 2.0 - s / 10, "grad_norm": 1.0}} for s in range(1, 6)]}
    batch["points"][2]["values"]["grad_norm"] = "NaN"
    batch["points"][3]["values"]["grad_norm"] = "Infinity"
    url = f"/attempts/{attempt['id']}/metrics"
    assert client.post(url, json=batch, headers=as_owner(attempt)).json() == {"accepted": 10, "duplicates": 0}
    assert client.post(url, json=batch, headers=as_owner(attempt)).json() == {"accepted": 0, "duplicates": 10}
    # Out of order and overlapping: only the new steps are stored.
    late = {"points": [{"step": 7, "values": {"loss": 1.0}}, {"step": 5, "values": {"loss": 9.9}}]}
    assert client.post(url, json=late, headers=as_owner(attempt)).json() == {"accepted": 1, "duplicates": 1}
    job = attempt["job_id"]
    page = client.get(f"/jobs/{job}/metrics?after=0&limit=3", headers=USER).json()
    assert [p["step"] for p in page["points"]] == [1, 2, 3] and page["next_after"] == 3
    assert page["points"][2]["values"] == {"grad_norm": "NaN", "loss": 1.7}
    rest = client.get(f"/jobs/{job}/metrics?after=3&limit=3", headers=USER).json()
    assert [p["step"] for p in rest["points"]] == [4, 5, 7] and rest["points"][0]["values"][
        "grad_norm"
    ] == "Infinity"
    assert rest["points"][1]["values"]["loss"] == 1.5
    series = client.get(f"/jobs/{job}/metrics/series/loss", headers=USER).json()
    assert series["steps"] == [1, 2, 3, 4, 5, 7]
    listed = client.get("/jobs", headers=USER).json()["data"][0]
    assert listed["last_step"] == 7 and listed["last_loss"] == 1.0


def test_bad_metric_batches_are_refused_whole(client: TestClient, worker_id: int) -> None:
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    url = f"/attempts/{attempt['id']}/metrics"
    for body in [
        {"points": "x"},
        {"points": [{"step": -1, "values": {}}]},
        {"points": [{"step": 1, "values": {"loss": "high"}}]},
        {"points": [{"step": 1, "values": {"bad key!": 1}}]},
        {"points": [{"step": 1, "values": {"loss": True}}]},
    ]:
        assert client.post(url, json=body, headers=as_owner(attempt)).status_code == 422, body
    assert client.post(url, content=b"{", headers=as_owner(attempt)).status_code == 422
    assert (
        client.post("/attempts/999/metrics", json={"points": []}, headers=as_owner(attempt)).status_code
        == 404
    )
    assert client.get(f"/jobs/{attempt['job_id']}/metrics", headers=USER).json()["points"] == []


def test_logs_by_offset_with_resends_and_bad_utf8(client: TestClient, worker_id: int) -> None:
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    url = f"/attempts/{attempt['id']}/logs"
    client.post(url, json={"offset": 0, "text": "step 1\n"}, headers=as_owner(attempt))
    client.post(
        url, json={"offset": 0, "text": "step 1\nstep 2\n"}, headers=as_owner(attempt)
    )  # resend, longer
    client.post(
        url, json={"offset": 0, "text": "step 1\n"}, headers=as_owner(attempt)
    )  # stale resend, shorter
    # A lone surrogate is valid JSON but not UTF-8: stored replaced, never a 500.
    raw = b'{"offset": 14, "text": "caf\\ufffd \\ud800\\n", "length": 8}'
    stored = client.post(url, content=raw, headers=as_owner(attempt) | {"content-type": "application/json"})
    assert stored.status_code == 422 and "unicode" in stored.text
    client.post(url, json={"offset": 14, "text": "caf\ufffd \n", "length": 8}, headers=as_owner(attempt))
    log = client.get(f"/jobs/{attempt['job_id']}/logs", headers=USER).json()
    assert log["text"].startswith("step 1\nstep 2\ncaf\ufffd ") and log["next_offset"] == 22
    tail = client.get(f"/jobs/{attempt['job_id']}/logs?offset=7", headers=USER).json()
    assert tail["text"].startswith("step 2\n")


def test_finish_is_idempotent_and_terminal(client: TestClient, worker_id: int) -> None:
    job_id = submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    url = f"/attempts/{attempt['id']}/finish"
    report = {
        "status": "failed",
        "exit_code": 42,
        "failure_class": "health:G002",
        "failure_code": "G002",
        "message": "adapter gradients were zero for 2 steps",
        "fix": "unfreeze the adapters",
        "log_tail": "...",
        "findings": [
            {
                "code": "G002",
                "severity": "error",
                "path": "model.freeze",
                "message": "adapters frozen",
                "where": "run",
            }
        ],
    }
    assert client.post(url, json=report, headers=as_owner(attempt)).json()["job_status"] == "failed"
    assert client.post(url, json=report, headers=as_owner(attempt)).status_code == 200
    conflict = client.post(url, json=report | {"status": "succeeded"}, headers=as_owner(attempt))
    assert conflict.status_code == 409
    job = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert (
        job["status"] == "failed"
        and job["failure_code"] == "G002"
        and job["failure_fix"] == "unfreeze the adapters"
    )
    assert job["attempts"][0]["exit_code"] == 42 and job["attempts"][0]["findings"][0]["code"] == "G002"


def test_a_batch_holding_a_step_twice_keeps_its_first_value_and_the_rest_of_the_batch(
    client: TestClient, worker_id: int
) -> None:
    """On PostgreSQL a new batch goes in by COPY, which refuses the repeated key as a whole: the batch
    must then fall back to the insert that keeps the first value, and lose nothing else."""
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    points = [{"step": s, "values": {"loss": float(s)}} for s in range(1, 5)]
    points.append({"step": 2, "values": {"loss": 99.0}})
    url = f"/attempts/{attempt['id']}/metrics"
    answer = client.post(url, json={"points": points}, headers=as_owner(attempt)).json()
    assert answer == {"accepted": 4, "duplicates": 1}
    page = client.get(f"/jobs/{attempt['job_id']}/metrics?after=0&limit=10", headers=USER).json()
    assert [(p["step"], p["values"]["loss"]) for p in page["points"]] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 4.0),
    ]


def test_events_are_idempotent_by_key(client: TestClient, worker_id: int) -> None:
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    event = {
        "key": "metrics:120",
        "kind": "health",
        "code": "H002",
        "severity": "warn",
        "message": "grad norm 2e3",
        "step": 4,
    }
    url = f"/attempts/{attempt['id']}/events"
    assert client.post(url, json={"events": [event]}, headers=as_owner(attempt)).json() == {
        "accepted": 1,
        "duplicates": 0,
    }
    assert client.post(url, json={"events": [event]}, headers=as_owner(attempt)).json() == {
        "accepted": 0,
        "duplicates": 1,
    }
    events = client.get(f"/jobs/{attempt['job_id']}/events", headers=USER).json()["events"]
    assert [e["code"] for e in events if e["kind"] == "health"] == ["H002"]
    after = client.get(f"/jobs/{attempt['job_id']}/events?after={events[-2]['id']}", headers=USER).json()
    assert [e["id"] for e in after["events"]] == [events[-1]["id"]]


def test_user_token_cannot_claim_or_report(client: TestClient, worker_id: int) -> None:
    assert client.post(f"/workers/{worker_id}/claim", json={}, headers=USER).status_code == 403
    assert client.post("/attempts/1/metrics", json={"points": []}, headers=USER).status_code == 403
    assert (
        client.post("/workers", json={"name": "x", "inventory": cpu_inventory()}, headers=USER).status_code
        == 403
    )


def test_a_claim_names_only_devices_the_worker_registered(client: TestClient) -> None:
    stuck = submit(
        client, resources={"gpus_per_node": 2, "accelerator": "gpu"}, training={"precision": "bf16"}
    )
    gpu_worker = register(client, "ampere", gpu_inventory(2))
    # Devices the worker never registered (or one twice) are refused before any job is taken.
    for devices in ([5, 6], [0, 0], [7, 1023]):
        answer = client.post(
            f"/workers/{gpu_worker}/claim", json={"devices": devices}, headers=as_worker(gpu_worker)
        )
        assert answer.status_code == 422 and "inventory" in answer.text, devices
    assert client.get(f"/jobs/{stuck}", headers=USER).json()["status"] == "queued"
    assert claim(client, gpu_worker)["job_id"] == stuck  # type: ignore[index]


@pytest.mark.parametrize("stamp", ["NaN", "Infinity", "-Infinity"])
def test_an_event_with_a_non_finite_time_is_refused_not_dropped(
    client: TestClient, worker_id: int, stamp: str
) -> None:
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    event = {"key": "k", "kind": "health", "severity": "warn", "message": "m", "time": stamp}
    answer = client.post(
        f"/attempts/{attempt['id']}/events", json={"events": [event]}, headers=as_owner(attempt)
    )
    assert answer.status_code == 422 and "time" in answer.text


def test_static_pages_carry_the_dashboards_security_headers(client: TestClient) -> None:
    for path in ("/", "/ui/static/job.html", "/ui/static/index.html", "/ui/static/js/job.js"):
        answer = client.get(path)
        assert answer.status_code == 200, path
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"], path
        assert answer.headers["x-content-type-options"] == "nosniff", path


def test_integers_beyond_what_storage_holds_are_refused_before_any_stream_starts(
    client: TestClient, worker_id: int
) -> None:
    job_id = submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    for query in ("offset=4611686018427387904", "attempt=1001", "attempt_id=9223372036854775808"):
        answer = client.get(f"/jobs/{job_id}/logs/stream?{query}", headers=USER)
        assert answer.status_code == 422, (query, answer.text)
    for query in ("after=4611686018427387904", "events_after=9223372036854775807"):
        assert client.get(f"/jobs/{job_id}/metrics/stream?{query}", headers=USER).status_code == 422, query
    url = f"/attempts/{attempt['id']}/logs"
    # A chunk's length is its size in output.log: between a third of the text's UTF-8 size and all of it.
    for length in (2**63 - 1, 100, 1):
        answer = client.post(
            url, json={"offset": 0, "text": "hello\n", "length": length}, headers=as_owner(attempt)
        )
        assert answer.status_code == 422, (length, answer.text)
    assert (
        client.post(
            url, json={"offset": 0, "text": "\ufffd\n", "length": 2}, headers=as_owner(attempt)
        ).status_code
        == 200
    )
    log = client.get(f"/jobs/{job_id}/logs", headers=USER).json()
    assert (
        log["next_offset"] == 2
        and client.get(f"/jobs/{job_id}/logs?offset=2", headers=USER).status_code == 200
    )
