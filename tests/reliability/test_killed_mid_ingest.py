"""A service SIGKILLed while an agent ships metrics loses no point it acknowledged, on either database.

A real `flightdeck serve` process takes 100-step batches from a client thread; it is killed with
SIGKILL in the middle of the stream and started again on the same database. Every point of every
batch answered 200 before the kill must be readable afterwards, with the value sent.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.agent.processes import WORKER_TOKEN, Service, free_tcp_port
from tests.service.factories import cpu_inventory, recipe

STEPS_PER_BATCH = 100

# Several real service processes and agents: the slow run (CI) covers it; the default run stays in its 6 minutes.
pytestmark = pytest.mark.slow


def _value(step: int) -> float:
    return round(1.0 / (step + 1), 9)


def test_a_killed_service_keeps_every_acknowledged_metric_point(tmp_path: Path, database_url: str) -> None:
    port = free_tcp_port()
    service = Service(tmp_path / "data", port, DATABASE_URL=database_url)
    service.start()
    acknowledged: list[int] = []  # first step of each batch answered 200
    try:
        with service.api() as api:
            job_id = api.post("/jobs", json=recipe(name="kill-mid-ingest")).json()["id"]
        enrol = {"Authorization": f"Bearer {WORKER_TOKEN}"}
        registered = httpx.post(
            f"{service.url}/workers", json={"name": "shipper", "inventory": cpu_inventory()}, headers=enrol
        ).json()
        worker = {"Authorization": f"Bearer {registered['token']}"}
        claimed = httpx.post(f"{service.url}/workers/{registered['id']}/claim", json={}, headers=worker)
        attempt_id = claimed.json()["attempt"]["id"]

        def ship() -> None:
            with httpx.Client(base_url=service.url, headers=worker, timeout=5) as client:
                first = 0
                while True:
                    points = [
                        {"step": s, "values": {"loss": _value(s)}}
                        for s in range(first, first + STEPS_PER_BATCH)
                    ]
                    try:
                        answer = client.post(f"/attempts/{attempt_id}/metrics", json={"points": points})
                    except httpx.TransportError:
                        return  # the service is gone: what was acknowledged is all that counts
                    if answer.status_code == 200:
                        acknowledged.append(first)
                    first += STEPS_PER_BATCH

        shipper = threading.Thread(target=ship, daemon=True)
        shipper.start()
        deadline = time.monotonic() + 30
        while len(acknowledged) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        service.kill()  # SIGKILL: no shutdown, no flush
        shipper.join(10)
        assert not shipper.is_alive() and len(acknowledged) >= 20
    finally:
        service.stop()

    again = Service(tmp_path / "data", port, DATABASE_URL=database_url)
    again.start()
    try:
        with again.api() as api:
            series = api.get(f"/jobs/{job_id}/metrics/series/loss", params={"limit": 1_000_000}).json()
        stored = dict(zip(series["steps"], series["values"], strict=True))
        missing = [
            s
            for first in acknowledged
            for s in range(first, first + STEPS_PER_BATCH)
            if stored.get(s) != _value(s)
        ]
        assert missing == [], f"{len(missing)} acknowledged points lost or changed, first {missing[:5]}"
    finally:
        again.stop()
