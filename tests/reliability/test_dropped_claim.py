"""A claim whose answer never reaches its agent costs the job no attempt (a real uvicorn, a real socket)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.reliability.conftest import make_settings, served
from tests.service.factories import USER, WORKER, as_worker, cpu_inventory, enrolled, recipe


def _open_long_poll(base_url: str, worker_id: int, token: str) -> socket.socket:
    """A claim long-poll sent on a raw socket, so the test can drop the connection mid-wait."""
    parts = urlsplit(base_url)
    sock = socket.create_connection((parts.hostname, parts.port))
    request = (
        f"POST /workers/{worker_id}/claim?wait=20 HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\n\r\n{}"
    )
    sock.sendall(request.encode())
    return sock


def test_a_dropped_long_poll_leaves_the_job_to_the_next_agent_with_no_attempt_spent(tmp_path: Path) -> None:
    with served(make_settings(tmp_path / "data", claim_max_wait_seconds=20)) as url:
        api = httpx.Client(base_url=url, timeout=30)
        workers = [
            enrolled(api.post("/workers", json={"name": name, "inventory": cpu_inventory()}, headers=WORKER))
            for name in ("vanishing", "steady")
        ]
        dropped = _open_long_poll(
            url, workers[0], as_worker(workers[0])["Authorization"].removeprefix("Bearer ")
        )
        time.sleep(0.5)  # the long-poll is waiting inside the service
        dropped.close()  # the agent stopped, or its connection broke
        time.sleep(0.3)
        job_id = api.post("/jobs", json=recipe(), headers=USER).json()["id"]
        started = time.monotonic()
        claimed = api.post(
            f"/workers/{workers[1]}/claim", params={"wait": 5}, json={}, headers=as_worker(workers[1])
        )
        assert claimed.status_code == 200, claimed.text
        attempt = claimed.json()["attempt"]
        assert (attempt["job_id"], attempt["number"]) == (job_id, 1)
        assert time.monotonic() - started < 3  # promptly: no lease had to run out
        job = api.get(f"/jobs/{job_id}", headers=USER).json()
        assert job["attempt_count"] == 1 and [a["worker_name"] for a in job["attempts"]] == ["steady"]


def test_an_attempt_handed_back_is_claimable_again_with_its_count_unchanged(tmp_path: Path) -> None:
    with served(make_settings(tmp_path / "data")) as url:
        api = httpx.Client(base_url=url, timeout=30)
        worker_id = enrolled(
            api.post("/workers", json={"name": "w", "inventory": cpu_inventory()}, headers=WORKER)
        )
        own = as_worker(worker_id)
        job_id = api.post("/jobs", json=recipe(), headers=USER).json()["id"]
        attempt = api.post(f"/workers/{worker_id}/claim", json={}, headers=own).json()["attempt"]
        handed = api.post(f"/attempts/{attempt['id']}/release", headers=own)
        assert handed.status_code == 200, handed.text
        assert handed.json() == {"job_id": job_id, "job_status": "queued", "attempt_count": 0}
        assert api.post(f"/attempts/{attempt['id']}/release", headers=own).status_code == 404
        again = api.post(f"/workers/{worker_id}/claim", json={}, headers=own).json()["attempt"]
        assert again["number"] == 1
        # Once the attempt has reported, it can no longer be handed back: it ends by finishing.
        points = {"points": [{"step": 1, "values": {"loss": 1.0}}]}
        assert api.post(f"/attempts/{again['id']}/metrics", json=points, headers=own).status_code == 200
        assert api.post(f"/attempts/{again['id']}/release", headers=own).status_code == 409
