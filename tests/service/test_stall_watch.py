"""H003: the service notices a run whose steps stopped coming, warns, then has it stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER, cpu_inventory, recipe


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[TestClient]:
    settings = make_settings(tmp_path / "data", reaper_interval_seconds=0.1, stall_min_seconds=30)
    with TestClient(create_app(settings)) as client:
        yield client


def _running_attempt(client: TestClient, step_times: list[float]) -> dict[str, object]:
    client.post("/jobs", json=recipe(), headers=USER)
    wid = client.post("/workers", json={"name": "w", "inventory": cpu_inventory()}, headers=WORKER).json()[
        "id"
    ]
    attempt: dict[str, object] = client.post(f"/workers/{wid}/claim", json={}, headers=WORKER).json()[
        "attempt"
    ]
    attempt["worker_id"] = wid
    points = [{"step": i + 1, "values": {"loss": 2.0}, "time": t} for i, t in enumerate(step_times)]
    client.post(f"/attempts/{attempt['id']}/metrics", json={"points": points}, headers=WORKER)
    return attempt


def _health_events(client: TestClient, job_id: object) -> list[dict[str, object]]:
    events = client.get(f"/jobs/{job_id}/events", headers=USER).json()["events"]
    return [e for e in events if e["code"] == "H003"]


def _wait(predicate: object, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_a_long_silence_stops_the_run_and_fails_the_job_with_h003(watched: TestClient) -> None:
    now = time.time()
    attempt = _running_attempt(watched, [now - 100, now - 99, now - 98, now - 97])
    _wait(lambda: any(e["severity"] == "fatal" for e in _health_events(watched, attempt["job_id"])))
    beat = watched.post(
        f"/workers/{attempt['worker_id']}/heartbeat", json={"attempts": [attempt["id"]]}, headers=WORKER
    ).json()
    assert beat["cancel"] == [attempt["id"]]
    # The agent stops the run and reports it the way it reports any stop order.
    report = {
        "status": "cancelled",
        "failure_class": "cancelled",
        "message": "stopped on the service's order",
    }
    watched.post(f"/attempts/{attempt['id']}/finish", json=report, headers=WORKER)
    job = watched.get(f"/jobs/{attempt['job_id']}", headers=USER).json()
    assert job["status"] == "failed" and job["failure_code"] == "H003"
    assert job["failure_class"] == "health:H003" and "median step time" in job["failure_message"]


def test_a_shorter_silence_only_warns_once(watched: TestClient) -> None:
    now = time.time()
    # 25 s of silence: past 2 x 10 x the 1 s median, but under the 30 s floor for a stop.
    attempt = _running_attempt(watched, [now - 28, now - 27, now - 26, now - 25])
    _wait(lambda: _health_events(watched, attempt["job_id"]))
    time.sleep(0.5)
    events = _health_events(watched, attempt["job_id"])
    assert [e["severity"] for e in events] == ["warn"]
    beat = watched.post(
        f"/workers/{attempt['worker_id']}/heartbeat", json={"attempts": [attempt["id"]]}, headers=WORKER
    ).json()
    assert beat["cancel"] == []


def test_steady_steps_raise_nothing(watched: TestClient) -> None:
    now = time.time()
    attempt = _running_attempt(watched, [now - 3, now - 2, now - 1, now])
    time.sleep(0.5)
    assert _health_events(watched, attempt["job_id"]) == []
