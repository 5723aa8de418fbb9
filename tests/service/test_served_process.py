"""`flightdeck serve` as a real process: migrates a fresh data dir, answers, survives a restart."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.factories import USER, USER_TOKEN, WORKER_TOKEN, recipe

# Several real service processes and agents: the slow run (CI) covers it; the default run stays in its 6 minutes.
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_service(data_dir: Path, port: int, database_url: str | None = None) -> subprocess.Popen[bytes]:
    env = os.environ | {"FLIGHTDECK_USER_TOKENS": USER_TOKEN, "FLIGHTDECK_WORKER_TOKENS": WORKER_TOKEN}
    if database_url:
        env["DATABASE_URL"] = database_url
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flightdeck.cli.main",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
        if process.poll() is not None:
            raise AssertionError(process.stdout.read().decode() if process.stdout else "service exited")
    process.kill()
    raise AssertionError("service did not answer /healthz within 30 s")


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "data"


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_serve_migrates_answers_and_keeps_jobs_across_restarts(data_dir: Path, database_url: str) -> None:
    port = free_port()
    process = start_service(data_dir, port, database_url)
    try:
        base = f"http://127.0.0.1:{port}"
        created = httpx.post(f"{base}/jobs", json=recipe(), headers=USER, timeout=10)
        assert created.status_code == 201, created.text
        # The embedded default's file, or nothing at all in the data dir's database slot.
        assert (data_dir / "flightdeck.db").exists() == database_url.startswith("sqlite")
    finally:
        stop(process)
    process = start_service(data_dir, port, database_url)
    try:
        listed = httpx.get(f"{base}/jobs", headers=USER, timeout=10).json()
        assert [j["id"] for j in listed["data"]] == [created.json()["id"]]
    finally:
        stop(process)


def test_stopping_answers_a_long_polling_claim_and_ends_streams_without_a_traceback(data_dir: Path) -> None:
    import threading

    from tests.service.factories import WORKER, as_worker, cpu_inventory, enrolled

    port = free_port()
    process = start_service(data_dir, port)
    base = f"http://127.0.0.1:{port}"
    worker_id = enrolled(
        httpx.post(f"{base}/workers", json={"name": "w", "inventory": cpu_inventory()}, headers=WORKER)
    )
    job = httpx.post(f"{base}/jobs", json=recipe(resources={"accelerator": "gpu"}), headers=USER).json()["id"]
    answers: dict[str, object] = {}

    def long_poll() -> None:
        url = f"{base}/workers/{worker_id}/claim?wait=30"
        answers["claim"] = httpx.post(url, json={}, headers=as_worker(worker_id), timeout=60).status_code

    def stream() -> None:
        with httpx.stream("GET", f"{base}/jobs/{job}/metrics/stream", headers=USER, timeout=60) as response:
            answers["stream"] = sum(1 for _ in response.iter_lines()) >= 0 and response.status_code

    threads = [threading.Thread(target=long_poll), threading.Thread(target=stream)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # both are waiting inside the service
    started = time.monotonic()
    stop(process)
    for thread in threads:
        thread.join(15)
    output = process.stdout.read().decode() if process.stdout else ""
    assert answers == {"claim": 204, "stream": 200}, (answers, output[-3000:])
    assert time.monotonic() - started < 4  # not the 5 s grace period: nothing had to be cancelled
    assert "Traceback" not in output and "CancelledError" not in output, output[-3000:]
