"""Real processes for end-to-end tests: the service (uvicorn) and agents in CPU mode, and a tiny recipe."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

USER_TOKEN = "test-user-token"
WORKER_TOKEN = "test-worker-token"
FLIGHTDECK = str(Path(sys.executable).with_name("flightdeck"))


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", **extra)
    return env


class Managed:
    """A child process in its own session, output in a log file, always stopped by the test."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path):
        self.argv, self.env, self.log_path = argv, env, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Service(Managed):
    def __init__(self, data_dir: Path, port: int, **settings: str):
        env = _base_env(
            FLIGHTDECK_USER_TOKENS=USER_TOKEN,
            FLIGHTDECK_WORKER_TOKENS=WORKER_TOKEN,
            FLIGHTDECK_REAPER_INTERVAL_SECONDS="0.5",
            **settings,
        )
        argv = [FLIGHTDECK, "serve", "--port", str(port), "--data-dir", str(data_dir)]
        argv += ["--log-level", "warning"]
        super().__init__(argv, env, data_dir.parent / f"service-{port}.log")
        self.url = f"http://127.0.0.1:{port}"
        self.started_before = False

    def start(self) -> None:
        # The port was free when it was picked, but another process may take it before the service
        # binds it (a connection's own ephemeral port): a first start then moves to another port, once
        # or twice. A later start (a restart) keeps its port: agents already know the URL.
        for tries_left in (2, 1, 0):
            seen = len(self.log())
            super().start()
            try:
                wait_until(self._healthy, 60, f"the service to answer /healthz\n{self.log()[-2000:]}")
            except AssertionError:
                taken = "address already in use" in self.log()[seen:]
                exited = self.proc is not None and self.proc.poll() is not None
                if self.started_before or not tries_left or not (exited and taken):
                    raise
                port = free_tcp_port()
                self.argv[self.argv.index("--port") + 1] = str(port)
                self.url = f"{self.url.rsplit(':', 1)[0]}:{port}"
                continue
            self.started_before = True
            return

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the service exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {USER_TOKEN}"}, timeout=30)


class Agent(Managed):
    def __init__(
        self,
        service: Service,
        workspace: Path,
        runs_dir: Path,
        name: str,
        slots: int = 2,
        scripts: bool = True,
        poll_wait: float = 2,
    ):
        argv = [FLIGHTDECK, "worker", "--workspace", str(workspace), "--runs-dir", str(runs_dir)]
        argv += ["--poll-wait", str(poll_wait), "--cancel-grace", "5"]
        argv += [] if scripts else ["--no-scripts"]
        # The rest through the environment, as in the worker image.
        env = _base_env(
            FLIGHTDECK_SERVICE_URL=service.url,
            FLIGHTDECK_WORKER_TOKEN=WORKER_TOKEN,
            FLIGHTDECK_CPU_SLOTS=str(slots),
            FLIGHTDECK_WORKER_NAME=name,
            # Node 0 of a multi-node job hosts the rendezvous here; every test agent is on this host.
            FLIGHTDECK_WORKER_ADDRESS="127.0.0.1",
        )
        super().__init__(argv, env, runs_dir.parent / f"agent-{name}.log")
        self.runs_dir = runs_dir

    def torchrun_pids(self) -> list[int]:
        return [int(pid) for pid in re.findall(r"torchrun pid (\d+)", self.log())]


def tiny_recipe(max_steps: int, name: str = "tiny-e2e", processes: int = 2) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"path": "models/tiny-llama", "dtype": "float32", "gradient_checkpointing": False},
        "data": {
            "train": [{"path": "data/chartqa", "preset": "chartqa", "split": "train"}],
            "max_seq_length": 64,
            "num_workers": 0,
        },
        "training": {
            "per_device_batch_size": 2,
            "gradient_accumulation_steps": 1,
            "learning_rate": 1e-3,
            "max_steps": max_steps,
            "precision": "fp32",
            "logging_steps": 1,
            "warmup_ratio": 0.0,
        },
        "resources": {"gpus_per_node": processes, "accelerator": "cpu"},
    }


def kill_strays(marker: str) -> None:
    """Kill processes our agents started that are still alive (found by the test's private path)."""
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != me and marker in " ".join(proc.info["cmdline"] or []):
                proc.kill()
        except psutil.Error:
            continue
