"""Fixtures for the Slurm tests: a real two-node cluster (cluster.py), a service its nodes reach, and
`flightdeck worker --executor slurm` submitting to it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..agent.conftest import tiny_workspace  # noqa: F401 - the session's tiny model and data
from ..agent.processes import (
    FLIGHTDECK,
    WORKER_TOKEN,
    Managed,
    Service,
    _base_env,
    free_tcp_port,
    kill_strays,
    wait_until,
)
from .cluster import HOST_ADDRESS, PARTITION, SlurmCluster, missing_binaries


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Started once per session (about 2 s once installed), torn down even when a test fails."""
    missing = missing_binaries()
    why = (
        "needs root (network namespaces)"
        if os.geteuid() != 0
        else f"needs {', '.join(missing)} (scripts/install-slurm.sh)"
        if missing
        else ""
    )
    if why:
        if os.environ.get("FLIGHTDECK_REQUIRE_SLURM") == "1":
            pytest.fail(f"the Slurm cluster {why}")
        pytest.skip(f"the Slurm cluster {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


class SlurmWorker(Managed):
    """`flightdeck worker --executor slurm` on this host (the cluster's "login node")."""

    def __init__(
        self,
        service: Service,
        cluster: SlurmCluster,
        workspace: Path,
        runs_dir: Path,
        name: str,
        partition: str = PARTITION,
        options: tuple[str, ...] = (),
    ):
        argv = [FLIGHTDECK, "worker", "--executor", "slurm", "--slurm-partition", partition, *options]
        argv += ["--workspace", str(workspace), "--runs-dir", str(runs_dir)]
        argv += ["--poll-wait", "2", "--cancel-grace", "3"]
        # Where a restarted worker finds its identity again (the default is under $HOME).
        argv += ["--slurm-state-file", str(runs_dir.parent / f"slurm-worker-{name}.json")]
        env = _base_env(
            FLIGHTDECK_SERVICE_URL=service.url,
            FLIGHTDECK_WORKER_TOKEN=WORKER_TOKEN,
            FLIGHTDECK_WORKER_NAME=name,
            SLURM_CONF=str(cluster.conf),
        )
        super().__init__(argv, env, runs_dir.parent / f"slurm-worker-{name}.log")
        self.runs_dir = runs_dir


@pytest.fixture
def on_slurm(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    tiny_workspace: Path,
) -> Iterator[Callable[..., tuple[Service, SlurmWorker]]]:
    """Factory: a service listening on the cluster's bridge and a Slurm worker registered with it."""
    started: list[Managed] = []

    def make(
        partition: str = PARTITION,
        worker_options: tuple[str, ...] = (),
        nodes_reach_service: bool = True,
        **service_settings: str,
    ) -> tuple[Service, SlurmWorker]:
        """`nodes_reach_service` False: the service listens on the host's loopback, which no node's
        namespace can reach (only the worker, on the host, does)."""
        # Each test starts on an idle cluster: a job the previous test's teardown cancelled may still be
        # completing on a node, and a two-node job would wait behind it.
        slurm_cluster.wait_idle(60)
        port = free_tcp_port()
        host = HOST_ADDRESS if nodes_reach_service else "127.0.0.1"
        service = Service(tmp_path / "data", port, FLIGHTDECK_HOST=host, **service_settings)
        service.url = f"http://{host}:{port}"
        started.append(service)
        service.start()
        worker = SlurmWorker(
            service, slurm_cluster, tiny_workspace, tmp_path / "runs", "slurm-test", partition, worker_options
        )
        started.append(worker)
        worker.start()
        return service, worker

    yield make
    # Printed for every test, shown by pytest for a failed one: what Slurm and the worker last said.
    print(slurm_cluster.state(), slurm_cluster.logs(), sep="\n")
    for managed in started:
        if isinstance(managed, SlurmWorker):
            print(f"--- worker log\n{managed.log()[-4000:]}")
    for managed in reversed(started):
        managed.stop(timeout=20)
    # Whatever a failed test left queued or running on the cluster, and stray local processes.
    subprocess.run(["scancel", "--user=root"], env=slurm_cluster.env, capture_output=True, timeout=30)
    kill_strays(str(tmp_path))


def slurm_events(api: Any, job_id: int) -> list[dict[str, Any]]:
    events = api.get(f"/jobs/{job_id}/events").json()["events"]
    return [e for e in events if e["kind"] == "slurm"]


def occupy_both_nodes(cluster: SlurmCluster) -> str:
    """Someone else's job holding every CPU of both nodes (120 s): Flightdeck's jobs wait in Slurm's queue.
    Its Slurm job id, for the test to scancel. Returned once it RUNS: a job submitted while it still
    pends waits behind it for `Priority`, not for `Resources`."""
    blocker = subprocess.run(
        ["sbatch", "--parsable", "-N2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 120"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    def running() -> bool:
        state = subprocess.run(
            ["squeue", "-h", "-j", blocker, "-o", "%T"],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return state.stdout.strip() == "RUNNING"

    wait_until(running, 30, f"the blocking Slurm job {blocker} to run")
    return blocker
