"""The claim fast path: well-formed claims skip the framework, every other request gets the route's answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.claim_fast_path import ClaimFastPath
from service.api.routes.workers import Claimed
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER, as_worker, cpu_inventory, enrolled, recipe


@pytest.fixture
def deferred(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the claims the fast path handed to the FastAPI route (a spy: the route still answers)."""
    seen: list[str] = []
    original = ClaimFastPath._defer

    async def spy(self: ClaimFastPath, scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(ClaimFastPath, "_defer", spy)
    return seen


@pytest.fixture
def small_bodies(tmp_path: Path) -> Iterator[TestClient]:
    """A service whose body limit is the smallest allowed, so an oversized claim is cheap to send."""
    with TestClient(create_app(make_settings(tmp_path / "data", max_body_bytes=1024))) as client:
        yield client


def _submit(client: TestClient, count: int = 1) -> list[int]:
    ids = []
    for i in range(count):
        answer = client.post("/jobs", json=recipe(name=f"fast-{i}"), headers=USER)
        assert answer.status_code == 201, answer.text
        ids.append(int(answer.json()["id"]))
    return ids


def _register(client: TestClient) -> int:
    answer = client.post("/workers", json={"name": "fast-1", "inventory": cpu_inventory()}, headers=WORKER)
    assert answer.status_code == 201, answer.text
    return enrolled(answer)


@pytest.mark.parametrize(
    "body",
    [
        {"json": {}},
        {"content": b""},
        {"content": b"null"},
        {"json": {"devices": [1, 0]}},
        {"json": {"devices": None}},
    ],
    ids=["empty-object", "no-body", "null", "devices", "devices-null"],
)
def test_a_well_formed_claim_is_served_by_the_fast_path(
    client: TestClient, worker_id: int, deferred: list[str], body: dict[str, Any]
) -> None:
    [job] = _submit(client)
    answer = client.post(f"/workers/{worker_id}/claim?wait=0.2", headers=as_worker(worker_id), **body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    claimed = Claimed.model_validate_json(answer.content).attempt  # the documented answer
    assert claimed.job_id == job and claimed.number == 1
    assert claimed.recipe["name"] == "fast-0" and claimed.plan["nproc_per_node"] == 2
    # Nothing left: 204 with no body, also without the framework.
    empty = client.post(f"/workers/{worker_id}/claim", headers=as_worker(worker_id), **body)
    assert (empty.status_code, empty.content) == (204, b"")
    assert deferred == []
    # What the fast path wrote is what the API shows.
    shown = client.get(f"/jobs/{job}", headers=USER).json()
    assert shown["status"] == "running" and [a["id"] for a in shown["attempts"]] == [claimed.id]


def test_a_long_poll_through_the_fast_path_wakes_when_a_job_is_queued(
    client: TestClient, worker_id: int, deferred: list[str]
) -> None:
    answers: list[Any] = []
    poller = threading.Thread(
        target=lambda: answers.append(
            client.post(f"/workers/{worker_id}/claim?wait=20", json={}, headers=as_worker(worker_id))
        )
    )
    poller.start()
    [job] = _submit(client)
    poller.join(timeout=15)
    assert not poller.is_alive(), "the long poll was not woken by the queued job"
    assert answers[0].status_code == 200 and answers[0].json()["attempt"]["job_id"] == job
    assert deferred == []


# The registered worker's own token, filled in when the test runs.
SELF: dict[str, str] = {"Authorization": "the worker's own token"}
# Each refusal: how it is asked, and what the route answers (status, and a piece of the body).
REFUSALS: dict[str, tuple[dict[str, str], str, dict[str, Any], int, str]] = {
    "no-token": ({}, "/workers/{w}/claim", {"json": {}}, 401, "missing bearer token"),
    "user-token": (USER, "/workers/{w}/claim", {"json": {}}, 403, "needs a worker token"),
    "unknown-token": (
        {"Authorization": "Bearer nope"},
        "/workers/{w}/claim",
        {"json": {}},
        401,
        "unknown token",
    ),
    "basic-scheme": (
        {"Authorization": "Basic abc"},
        "/workers/{w}/claim",
        {"json": {}},
        401,
        "missing bearer",
    ),
    "enrolment-token": (WORKER, "/workers/{w}/claim", {"json": {}}, 403, "only registers a worker"),
    "another-worker": (SELF, "/workers/987654/claim", {"json": {}}, 403, "belongs to worker"),
    "worker-id-too-large": (SELF, f"/workers/{2**63}/claim", {"json": {}}, 422, "less than or equal"),
    "negative-worker-id": (SELF, "/workers/-1/claim", {"json": {}}, 422, "greater than or equal"),
    "wait-negative": (SELF, "/workers/{w}/claim?wait=-1", {"json": {}}, 422, "greater than or equal"),
    "wait-too-long": (SELF, "/workers/{w}/claim?wait=300.5", {"json": {}}, 422, "less than or equal"),
    "wait-not-a-number": (SELF, "/workers/{w}/claim?wait=soon", {"json": {}}, 422, "valid number"),
    "wait-nan": (SELF, "/workers/{w}/claim?wait=nan", {"json": {}}, 422, "wait"),
    "device-negative": (SELF, "/workers/{w}/claim", {"json": {"devices": [-1]}}, 422, '"devices", 0'),
    "body-not-json": (SELF, "/workers/{w}/claim", {"content": b"devices please"}, 422, '"body"'),
    "body-a-list": (SELF, "/workers/{w}/claim", {"json": [0, 1]}, 422, '"body"'),
}


@pytest.mark.parametrize("case", list(REFUSALS), ids=list(REFUSALS))
def test_every_refusal_is_the_routes_own_answer(
    client: TestClient, worker_id: int, deferred: list[str], case: str
) -> None:
    headers, path, body, status, detail = REFUSALS[case]
    headers = as_worker(worker_id) if headers is SELF else headers
    [job] = _submit(client)
    answer = client.post(path.format(w=worker_id), headers=headers, **body)
    assert answer.status_code == status, answer.text
    assert detail in answer.text
    assert len(deferred) == 1  # handed to the route, which wrote the refusal
    # A refused claim took no job.
    assert client.get(f"/jobs/{job}", headers=USER).json()["status"] == "queued"


def test_odd_but_valid_spellings_are_left_to_the_route(
    client: TestClient, worker_id: int, deferred: list[str]
) -> None:
    """An exponent or a repeated parameter is the route's to read: the fast path never guesses."""
    _submit(client, 2)
    for query in ("wait=1e-1", "wait=0&wait=0.1"):
        answer = client.post(f"/workers/{worker_id}/claim?{query}", json={}, headers=as_worker(worker_id))
        assert answer.status_code == 200, answer.text
    assert len(deferred) == 2


def test_an_oversized_claim_body_is_refused_413_whether_announced_or_streamed(
    small_bodies: TestClient, deferred: list[str]
) -> None:
    client = small_bodies
    worker_id = _register(client)
    [job] = _submit(client)
    big = b'{"devices": [' + b"0, " * 600 + b"0]}"
    announced = client.post(f"/workers/{worker_id}/claim", content=big, headers=as_worker(worker_id))
    streamed = client.post(
        f"/workers/{worker_id}/claim", content=iter([big[:700], big[700:]]), headers=as_worker(worker_id)
    )
    for answer in (announced, streamed):
        assert answer.status_code == 413, answer.text
        assert "larger than 1024 bytes" in answer.json()["detail"]
    assert len(deferred) == 2
    assert client.get(f"/jobs/{job}", headers=USER).json()["status"] == "queued"


def test_fast_path_claims_are_timed_and_counted_like_the_routes(
    client: TestClient, worker_id: int, deferred: list[str]
) -> None:
    _submit(client)
    assert (
        client.post(f"/workers/{worker_id}/claim", json={}, headers=as_worker(worker_id)).status_code == 200
    )
    assert (
        client.post(f"/workers/{worker_id}/claim", json={}, headers=as_worker(worker_id)).status_code == 204
    )
    assert client.post(f"/workers/{worker_id}/claim", json={}, headers=USER).status_code == 403
    assert len(deferred) == 1
    text = client.get("/metrics").text
    for outcome in ("claimed", "empty", "error"):
        assert f'flightdeck_claim_duration_seconds_count{{outcome="{outcome}"}} 1.0' in text
    for status in (200, 204, 403):
        route = 'route="/workers/{worker_id}/claim"'
        assert (
            f'flightdeck_request_duration_seconds_count{{method="POST",{route},status="{status}"}} 1.0'
            in text
        )
