"""Dispatch through Slurm: from POST /jobs returning to torchrun started on a Slurm node.

`python -m bench.dispatch --executor slurm`: the tests' real two-node cluster (tests/slurm/cluster.py:
Debian's Slurm 22.05 in network namespaces; needs root and scripts/install-slurm.sh), a service on the
cluster's bridge and `flightdeck worker --executor slurm`. The path measured: the worker's long-poll
claim, its sbatch, Slurm's scheduling, srun starting the attempt runner on the node, its host check,
then torchrun's fork. torchrun is not a child of anything the bench starts (slurmstepd starts the
runner), so the host's process table is polled for new torchrun processes and each one's fork time
is read from the kernel.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from bench.dispatch import FLIGHTDECK, TERMINAL, _wait_agent_idle, _wait_job, dispatch_recipe, make_workspace
from bench.harness import Server, start_flightdeck, stop_process
from tests.slurm.cluster import HOST_ADDRESS, PARTITION, SlurmCluster, missing_binaries


class TorchrunStarts:
    """The fork time of each new torchrun on this host, by Slurm node, polled every `interval` seconds.

    The kernel keeps each process's start time (its fork, in clock ticks: 10 ms here), so the poll
    needs no millisecond loop over /proc: a torchrun found 50 ms late still counts from its fork. The
    Slurm nodes are namespaces of this host, so their processes are in this host's process table; a
    torchrun's node is the SLURMD_NODENAME that srun gave its runner.
    """

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.before: set[int] = set()

    def __enter__(self) -> TorchrunStarts:
        self.before = set(psutil.pids())  # processes from before do not count
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def _found(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
            if proc.pid in self.before or "torch.distributed.run" not in " ".join(proc.info["cmdline"] or []):
                continue
            try:
                node = proc.environ().get("SLURMD_NODENAME", "?")
            except psutil.Error:
                continue
            found[node] = min(found.get(node, float("inf")), float(proc.info["create_time"]))
        return found

    def started_on(self, nodes: int, timeout: float) -> float:
        """The epoch time the last of `nodes` nodes forked its torchrun."""
        deadline = time.monotonic() + timeout
        found: dict[str, float] = {}
        while time.monotonic() < deadline:
            found = self._found()
            if len(found) >= nodes:
                return max(sorted(found.values())[:nodes])
            time.sleep(self.interval)
        raise TimeoutError(
            f"torchrun started on {len(found)} of {nodes} Slurm node(s) within {timeout:.0f} s"
        )


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
    (root / "slurm").mkdir(parents=True, exist_ok=True)
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
                with TorchrunStarts() as watch:
                    answer = user.post("/jobs", json={**recipe, "name": f"dispatch-slurm-{index}"})
                    returned = time.time()  # the epoch clock: the kernel's process start times are on it
                    answer.raise_for_status()
                    started = watch.started_on(nodes=1, timeout=120)
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
