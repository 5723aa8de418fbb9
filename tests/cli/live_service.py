"""A real Flightdeck service on 127.0.0.1 (uvicorn in a thread) and a worker driven by hand over HTTP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from flightdeck.service.api.app import create_app
from flightdeck.service.core.config import Settings

USER_TOKEN = "cli-user-token"
WORKER_TOKEN = "cli-worker-token"


def minimal_recipe(name: str = "t", **overrides: Any) -> dict[str, Any]:
    """The smallest recipe the schema accepts, runnable on a CPU worker."""
    return {
        "name": name,
        "model": {"path": "models/tiny-llama"},
        "data": {"train": [{"path": "data/x.jsonl"}]},
        "resources": {"accelerator": "any"},
    } | overrides


@dataclass
class LiveService:
    url: str
    user: httpx.Client
    worker: httpx.Client  # authenticates as the most recently registered worker (its own token)
    enrol: httpx.Client  # the enrolment token: registers workers

    def submit(self, recipe: dict[str, Any]) -> int:
        answer = self.user.post("/jobs", json=recipe)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    def register_worker(self, name: str = "cpu-1", runs_dir: str = "/ws/runs") -> int:
        inventory = {
            "hostname": "cpu-host",
            "cpu_slots": 2,
            "cores": 2,
            "workspace": "/ws",
            "runs_dir": runs_dir,
        }
        answer = self.enrol.post("/workers", json={"name": name, "inventory": inventory})
        assert answer.status_code == 201, answer.text
        self.worker.headers["Authorization"] = f"Bearer {answer.json()['token']}"
        return int(answer.json()["id"])

    def claim(self, worker_id: int) -> dict[str, Any]:
        answer = self.worker.post(f"/workers/{worker_id}/claim", json={})
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["attempt"])

    def start_job(self, recipe: dict[str, Any], worker: str = "cpu-1") -> tuple[int, int]:
        """Submit and claim a job; (job id, attempt id)."""
        job_id = self.submit(recipe)
        attempt = self.claim(self.register_worker(worker))
        assert attempt["job_id"] == job_id
        return job_id, int(attempt["id"])

    def start_gang(
        self, recipe: dict[str, Any], workers: tuple[str, ...]
    ) -> tuple[int, int, list[httpx.Client]]:
        """Submit a multi-node job and let `workers` gang-claim it in that order (their node ranks);
        (job id, attempt id, a client per node rank authenticated as that node's worker)."""
        job_id = self.submit(recipe)
        joined = []
        for name in workers:  # all alive first: a job no gang could fill is not joined
            worker_id = self.register_worker(name)
            headers = {"Authorization": self.worker.headers["Authorization"]}
            joined.append((worker_id, httpx.Client(base_url=self.url, headers=headers, timeout=30)))
        for worker_id, client in joined:
            filled = client.post(f"/workers/{worker_id}/claim", json={})  # the last join fills the gang
        assert filled.status_code == 200, filled.text
        for worker_id, client in joined[:-1]:  # the others get their node from their next claim
            assert client.post(f"/workers/{worker_id}/claim", json={}).status_code == 200
        return job_id, int(filled.json()["attempt"]["id"]), [client for _, client in joined]

    def metrics(self, attempt_id: int, steps: range, **extra: float) -> None:
        points = [
            {
                "step": s,
                "values": {
                    "loss": 3.0 / (s + 1),
                    "learning_rate": 1e-4,
                    "grad_norm": 1.0 + s / 100,
                    "adapter_grad_norm": 0.5,
                    "tokens_per_second": 1000.0 + s,
                    **extra,
                },
                "time": time.time(),
            }
            for s in steps
        ]
        answer = self.worker.post(f"/attempts/{attempt_id}/metrics", json={"points": points})
        assert answer.status_code == 200, answer.text

    def log(self, attempt_id: int, offset: int, text: str) -> int:
        answer = self.worker.post(f"/attempts/{attempt_id}/logs", json={"offset": offset, "text": text})
        assert answer.status_code == 200, answer.text
        return offset + len(text.encode())

    def event(self, attempt_id: int, key: str, step: int, code: str, severity: str, message: str) -> None:
        body = {
            "events": [
                {
                    "key": key,
                    "kind": "health",
                    "code": code,
                    "severity": severity,
                    "message": message,
                    "fix": "lower the learning rate",
                    "step": step,
                }
            ]
        }
        answer = self.worker.post(f"/attempts/{attempt_id}/events", json=body)
        assert answer.status_code == 200, answer.text

    def finish(self, attempt_id: int, status: str, **report: Any) -> dict[str, Any]:
        answer = self.worker.post(f"/attempts/{attempt_id}/finish", json={"status": status, **report})
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def job(self, job_id: int) -> dict[str, Any]:
        answer = self.user.get(f"/jobs/{job_id}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


@contextmanager
def live_service(data_dir: Path, **settings: Any) -> Iterator[LiveService]:
    """Serve create_app(settings) on a free 127.0.0.1 port until the block ends."""
    unknown = set(settings) - set(Settings.model_fields)  # Settings would ignore them without a word
    assert not unknown, f"not fields of Settings: {sorted(unknown)}"
    app = create_app(
        Settings(data_dir=data_dir, user_tokens=[USER_TOKEN], worker_tokens=[WORKER_TOKEN], **settings)
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # A short graceful shutdown: open event streams must not hold the test's teardown.
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the service did not start")
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    user = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {USER_TOKEN}"}, timeout=30)
    enrol = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {WORKER_TOKEN}"}, timeout=30)
    worker = httpx.Client(base_url=url, timeout=30)
    try:
        yield LiveService(url=url, user=user, worker=worker, enrol=enrol)
    finally:
        user.close()
        worker.close()
        enrol.close()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
