"""Dispatch through Slurm: from POST /jobs returning to torchrun started on a Slurm node.

`python -m bench.dispatch --executor slurm`: the tests' real two-node cluster (tests/slurm/cluster.py:
Debian's Slurm 22.05 in network namespaces; needs root and scripts/install-slurm.sh), a service on the
cluster's bridge and `flightdeck worker --executor slurm`. The path measured: the worker's long-poll
claim, its sbatch, Slurm's scheduling, srun starting the attempt runner on the node, its host check,
then torchrun's fork. torchrun is not a child of anything the bench starts (slurmstepd starts the
runner), so every new process on the host is noted as it appears and the first that turns out to be
torchrun is taken.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.dispatch import FLIGHTDECK, TERMINAL, _wait_agent_idle, _wait_job, dispatch_recipe, make_workspace
from bench.harness import Server, start_flightdeck, stop_process
from tests.slurm.cluster import HOST_ADDRESS, PARTITION, SlurmCluster, missing_binaries


class NewProcessWatch:
    """Notes when each process of this host first appears, polling /proc every `interval` seconds."""

    def __init__(self, interval: float = 0.001):
        self.interval = interval
        self.first_seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.perf_counter()
            for pid in psutil.pids():
                self.first_seen.setdefault(pid, now)
            self._stop.wait(self.interval)

    def __enter__(self) -> NewProcessWatch:
        self.first_seen = dict.fromkeys(psutil.pids(), 0.0)  # processes from before do not count
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def torchrun_started(self, timeout: float) -> float:
        """When the first new process that turns out to be torchrun appeared (its fork, before its exec);
        a process is looked at until it has exec'd something else, or is gone."""
        settled: set[int] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid, seen in sorted(self.first_seen.items(), key=lambda item: item[1]):
                if not seen or pid in settled:
                    continue
                try:
                    cmdline = " ".join(psutil.Process(pid).cmdline())
                except psutil.Error:
                    settled.add(pid)
                    continue
                if "torch.distributed.run" in cmdline or "torchrun" in cmdline:
                    return seen
                if "flightdeck.worker.agent.run_attempt" not in cmdline:
                    settled.add(pid)  # exec'd something else: the runner's fork shows the runner's line
            time.sleep(0.002)
        raise TimeoutError("no torchrun started on a Slurm node")


def start_slurm_worker(server: Any, cluster: SlurmCluster, workspace: Path, root: Path) -> Server:
    argv = [*FLIGHTDECK, "worker", "--executor", "slurm", "--slurm-partition", PARTITION]
    argv += ["--service", server.url, "--workspace", str(workspace), "--runs-dir", str(root / "runs-slurm")]
    argv += ["--name", "dispatch-slurm", "--cancel-grace", "2"]
    argv += ["--slurm-state-file", str(root / "slurm-worker.json")]
    env = {**cluster.env, "FLIGHTDECK_WORKER_TOKEN": server.worker_token}
    log_path = root / "dispatch-slurm-worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=workspace, env=env)
    return Server(server.url, process, log_path)


def bench_slurm(args: Any, root: Path) -> list[float]:
    """POST /jobs -> torchrun started on the Slurm node (one-node jobs, one at a time, each cancelled)."""
    missing = missing_binaries()
    if missing:
        raise SystemExit(f"--executor slurm needs root and {', '.join(missing)} (scripts/install-slurm.sh)")
    workspace = make_workspace(args.workspace or root / "workspace")
    cluster = SlurmCluster(root / "slurm")
    cluster.start()
    server = worker = None
    try:
        server = start_flightdeck(
            root / "flightdeck-slurm", env={"FLIGHTDECK_LEASE_SECONDS": "3"}, host=HOST_ADDRESS
        )
        worker = start_slurm_worker(server, cluster, workspace, root)
        recipe = dispatch_recipe(args.max_steps)
        latencies = []
        with server.client(server.user_token) as user:
            _wait_agent_idle(user)
            for index in range(-args.warmup, args.jobs):
                _wait_agent_idle(user)
                cluster.wait_idle(60)
                with NewProcessWatch() as watch:
                    answer = user.post("/jobs", json={**recipe, "name": f"dispatch-slurm-{index}"})
                    returned = time.perf_counter()
                    answer.raise_for_status()
                    started = watch.torchrun_started(timeout=120)
                job_id = int(answer.json()["id"])
                elapsed = (started - returned) * 1e3
                if index >= 0:
                    latencies.append(elapsed)
                label = f"job {index + 1}" if index >= 0 else "warm-up job"
                print(
                    f"slurm, {label}: torchrun started on the node {elapsed:.0f} ms after POST /jobs",
                    flush=True,
                )
                if not args.let_run:
                    user.post(f"/jobs/{job_id}/cancel")
                _wait_job(user, job_id, TERMINAL, timeout=300)
        return latencies
    finally:
        if worker is not None:
            stop_process(worker.pid, grace=20)
        if server is not None:
            server.stop()
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["scancel", "--user=root"], env=cluster.env, capture_output=True, timeout=30)
        cluster.stop()
