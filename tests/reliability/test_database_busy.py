"""Database busy: 20 agents at once against one real service, on a fresh SQLite file and on PostgreSQL.

Each agent thread registers, then claims, heartbeats, ships metric batches and a log chunk, and
finishes, until every job is done or the time is up. Every job must be claimed exactly once, no
answer may be a 5xx or mention a locked database, and every metric point sent must be stored.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.processes import WORKER_TOKEN, Service, free_tcp_port
from tests.service.factories import cpu_inventory, recipe

AGENTS = 20
JOBS = 40
BATCHES_PER_JOB = 4
STEPS_PER_BATCH = 25
KEYS = ("loss", "grad_norm", "learning_rate")
TIME_LIMIT_S = 20.0

# Several real service processes and agents: the slow run (CI) covers it; the default run stays in its 6 minutes.
pytestmark = pytest.mark.slow


@dataclass
class Tally:
    """What the agents saw, shared between their threads under a lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    claimed: list[int] = field(default_factory=list)
    sent: Counter[int] = field(default_factory=Counter)  # job id -> metric values sent
    bad: list[str] = field(default_factory=list)
    finished: int = 0

    def check(self, answer: httpx.Response, what: str) -> httpx.Response:
        if answer.status_code >= 400 or "locked" in answer.text.lower():
            with self.lock:
                self.bad.append(f"{what}: {answer.status_code} {answer.text[:200]}")
        return answer


def _run_one(api: httpx.Client, tally: Tally, worker_id: int, attempt: dict[str, Any]) -> None:
    attempt_id, job_id = attempt["id"], attempt["job_id"]
    url = f"/attempts/{attempt_id}"
    for batch in range(BATCHES_PER_JOB):
        first = batch * STEPS_PER_BATCH + 1
        points = [
            {"step": s, "values": {k: s / 10 for k in KEYS}, "time": time.time()}
            for s in range(first, first + STEPS_PER_BATCH)
        ]
        answer = tally.check(api.post(f"{url}/metrics", json={"points": points}), "metrics")
        if answer.status_code == 200:
            with tally.lock:
                tally.sent[job_id] += answer.json()["accepted"]
        tally.check(api.post(f"/workers/{worker_id}/heartbeat", json={"attempts": [attempt_id]}), "heartbeat")
    tally.check(api.post(f"{url}/logs", json={"offset": 0, "text": f"job {job_id} ran\n"}), "logs")
    finish = {"status": "succeeded", "exit_code": 0, "message": "done"}
    if tally.check(api.post(f"{url}/finish", json=finish), "finish").status_code == 200:
        with tally.lock:
            tally.finished += 1


def _agent(base_url: str, index: int, tally: Tally, deadline: float) -> None:
    headers = {"Authorization": f"Bearer {WORKER_TOKEN}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as api:
        body = {"name": f"busy-{index}", "inventory": cpu_inventory(slots=1)}
        registered = tally.check(api.post("/workers", json=body), "register")
        if registered.status_code != 201:
            return
        worker_id = registered.json()["id"]
        # Every later call as this worker, with the token its registration returned.
        api.headers["Authorization"] = f"Bearer {registered.json()['token']}"
        while time.monotonic() < deadline and tally.finished < JOBS:
            answer = tally.check(
                api.post(f"/workers/{worker_id}/claim", json={}, params={"wait": 0.5}), "claim"
            )
            if answer.status_code != 200:
                continue
            attempt = answer.json()["attempt"]
            with tally.lock:
                tally.claimed.append(attempt["job_id"])
            _run_one(api, tally, worker_id, attempt)


def test_twenty_agents_at_once_lose_and_duplicate_nothing(tmp_path: Path, database_url: str) -> None:
    service = Service(tmp_path / "data", free_tcp_port(), DATABASE_URL=database_url)
    service.start()
    try:
        with service.api() as api:
            jobs = []
            for number in range(JOBS):
                sent = recipe(name=f"busy-{number}", resources={"gpus_per_node": 1, "accelerator": "any"})
                created = api.post("/jobs", json=sent)
                assert created.status_code == 201, created.text
                jobs.append(created.json()["id"])
            tally = Tally()
            deadline = time.monotonic() + TIME_LIMIT_S
            agents = [
                threading.Thread(target=_agent, args=(service.url, i, tally, deadline), daemon=True)
                for i in range(AGENTS)
            ]
            for agent in agents:
                agent.start()
            for agent in agents:
                agent.join(TIME_LIMIT_S + 40)
            assert not any(a.is_alive() for a in agents), "an agent thread did not stop"

            assert tally.bad == [], tally.bad[:10]
            assert sorted(tally.claimed) == sorted(jobs), "every job claimed exactly once"
            expected = BATCHES_PER_JOB * STEPS_PER_BATCH * len(KEYS)
            for job_id in jobs:
                job = api.get(f"/jobs/{job_id}").json()
                assert (job["status"], len(job["attempts"])) == ("succeeded", 1), job
                points = api.get(f"/jobs/{job_id}/metrics", params={"limit": 10_000}).json()["points"]
                stored = sum(len(p["values"]) for p in points)
                assert stored == tally.sent[job_id] == expected, job_id
        assert "database is locked" not in service.log()
    finally:
        service.stop()


CLAIM_ONLY_JOBS = 500


def test_twenty_agents_claim_five_hundred_jobs_each_exactly_once(tmp_path: Path, database_url: str) -> None:
    """Claims alone, as fast as 20 agents can ask: no job twice, none left, no error answer."""
    service = Service(tmp_path / "data", free_tcp_port(), DATABASE_URL=database_url)
    service.start()
    try:
        with service.api() as api:
            body = recipe(name="claim-only", resources={"gpus_per_node": 1, "accelerator": "any"})
            jobs = [api.post("/jobs", json=body).json()["id"] for _ in range(CLAIM_ONLY_JOBS)]
        tally = Tally()

        def agent(index: int) -> None:
            with httpx.Client(base_url=service.url, timeout=30) as client:
                answer = client.post(
                    "/workers",
                    json={"name": f"claimer-{index}", "inventory": cpu_inventory(slots=1)},
                    headers={"Authorization": f"Bearer {WORKER_TOKEN}"},
                )
                worker_id, token = answer.json()["id"], answer.json()["token"]
                client.headers["Authorization"] = f"Bearer {token}"
                deadline = time.monotonic() + TIME_LIMIT_S
                while time.monotonic() < deadline:
                    claimed = tally.check(client.post(f"/workers/{worker_id}/claim", json={}), "claim")
                    if claimed.status_code == 204:
                        return  # the queue is empty (wait=0 answers at once)
                    if claimed.status_code == 200:
                        with tally.lock:
                            tally.claimed.append(claimed.json()["attempt"]["job_id"])

        threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(AGENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIME_LIMIT_S + 20)
        assert tally.bad == [], tally.bad[:10]
        twice = [job for job, n in Counter(tally.claimed).items() if n > 1]
        assert twice == [] and sorted(tally.claimed) == sorted(jobs)
    finally:
        service.stop()
