"""`scripts/run.sh` as the README starts it: the local worker's workspace holds models, data, runs and
the example scripts, and nothing a script job could turn against the host (the virtualenv, the
service's database and tokens, Flightdeck's source)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.agent.processes import free_tcp_port, wait_until

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _workers(api: httpx.Client) -> list[dict[str, object]] | None:
    try:
        return api.get("/workers").json()  # type: ignore[no-any-return]
    except httpx.TransportError:
        return None


def test_run_sh_gives_the_worker_a_workspace_of_its_own(tmp_path: Path) -> None:
    port = free_tcp_port()
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env |= {"FLIGHTDECK_PORT": str(port), "FLIGHTDECK_DATA_DIR": str(data_dir)}
    log = (tmp_path / "run.log").open("wb")
    process = subprocess.Popen(
        ["bash", "scripts/run.sh"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: (data_dir / "tokens.env").exists(), 300, "run.sh to start the service")
        tokens = dict(line.split("=", 1) for line in (data_dir / "tokens.env").read_text().split())
        api = httpx.Client(base_url=base, timeout=30)
        api.headers["Authorization"] = f"Bearer {tokens['FLIGHTDECK_USER_TOKENS']}"
        # tokens.env is written as the service starts, before it listens: connection refused is "not yet".
        workers = wait_until(lambda: _workers(api), 120, "the local worker to register")
        workspace = Path(workers[0]["inventory"]["workspace"])
        assert workspace == REPO / "workspace"
        held = {p.name for p in workspace.iterdir()}
        assert {"models", "data", "examples"} <= held, held
        assert not held & {".venv", "flightdeck-data", "service", "worker", "cli", "pyproject.toml"}, held
        assert data_dir.resolve() not in [workspace.resolve(), *workspace.resolve().parents]
        # The attack as reported: refused at submit, and there is no virtualenv in the workspace anyway.
        attack = {
            "name": "p",
            "resources": {"accelerator": "cpu"},
            "entrypoint": {"script": ".venv/bin/torchrun", "args": ["--no-python", "/bin/sh", "-c", "id"]},
        }
        assert api.post("/jobs", json=attack).status_code == 422
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()
