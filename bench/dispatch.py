"""Dispatch: from POST /jobs returning to an idle, long-polling agent having started torchrun.

Run: `python -m bench.dispatch` (a real `flightdeck worker` with one CPU slot and a tiny model);
`--claim-only` measures up to a long-polling claim returning instead, with no agent and no torch;
`--executor slurm` measures the Slurm executor on the tests' real cluster (bench/dispatch_slurm.py)
beside the own agent, in the same command.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import psutil
import typer

from bench.harness import (
    RESULTS_DIR,
    ROOT,
    ClientKind,
    Flightdeck,
    NoMlflow,
    Reps,
    ResultsDir,
    Server,
    Table,
    WorkDir,
    register_worker,
    run_cli,
    scratch_dir,
    start_flightdeck,
    stop_process,
    summary,
    wait_idle,
    write_results,
)

TERMINAL = {"succeeded", "failed", "cancelled"}
FLIGHTDECK = [sys.executable, "-c", "from flightdeck.cli.main import main; main()"]


def dispatch_recipe(max_steps: int, nodes: int = 1) -> dict[str, Any]:
    """The tiny demo recipe on one CPU slot per node, from examples/ so it stays a recipe users run."""
    recipe: dict[str, Any] = json.loads((ROOT / "examples" / "tiny-demo.json").read_text())
    recipe["data"]["train"] = recipe["data"]["train"][:1]
    recipe["resources"] = {"nodes": nodes, "gpus_per_node": 1, "accelerator": "cpu"}
    recipe["training"]["max_steps"] = max_steps
    return recipe


def make_workspace(path: Path) -> Path:
    """A workspace with the tiny llama model and the demo data (built by the `flightdeck` commands)."""
    if not (path / "models" / "tiny-llama").exists():
        subprocess.run([*FLIGHTDECK, "make-tiny-model", str(path / "models" / "tiny-llama")], check=True)
        subprocess.run([*FLIGHTDECK, "make-demo-data", str(path / "data")], check=True)
    return path


def start_agent(server: Flightdeck, workspace: Path, log_path: Path, name: str = "dispatch-agent") -> Server:
    argv = [
        *FLIGHTDECK,
        "worker",
        "--service",
        server.url,
        "--token",
        server.worker_token,
        "--cpu-slots",
        "1",
        "--workspace",
        str(workspace),
        "--runs-dir",
        str(log_path.parent / f"runs-{name}"),
        "--name",
        name,
        "--address",
        "127.0.0.1",  # the nodes of a multi-node job meet on this host
        "--cancel-grace",
        "2",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=workspace)
    return Server(server.url, process, log_path)


class ChildWatch:
    """Notes when each child of a process first appears, polling /proc every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.001):
        self.parent = psutil.Process(pid)
        self.interval = interval
        self.first_seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.perf_counter()
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in self.parent.children(recursive=False):
                    self.first_seen.setdefault(child.pid, now)
            self._stop.wait(self.interval)

    def __enter__(self) -> ChildWatch:
        self.first_seen = {c.pid: 0.0 for c in self.parent.children()}  # children from before do not count
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def torchrun_started(self, timeout: float) -> float:
        """When the first new child that turns out to be torchrun appeared (its fork, before its exec)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid, seen in sorted(self.first_seen.items(), key=lambda item: item[1]):
                if seen and _is_torchrun(pid):
                    return seen
            time.sleep(0.01)
        raise TimeoutError("the agent started no torchrun")


def _is_torchrun(pid: int) -> bool:
    # Right after fork the child still shows the agent's command line; wait for its exec.
    for _ in range(200):
        try:
            cmdline = " ".join(psutil.Process(pid).cmdline())
        except psutil.NoSuchProcess:
            return False
        if "torch.distributed.run" in cmdline or "torchrun" in cmdline:
            return True
        if "flightdeck.worker.agent.watchdog" in cmdline:
            return False
        time.sleep(0.005)
    return False


def _wait_job(user: Any, job_id: int, wanted: set[str], timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = str(user.get(f"/jobs/{job_id}").json()["status"])
        if status in wanted:
            return status
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} did not reach {wanted}")


def _wait_agent_idle(user: Any) -> None:
    """Until the agent runs nothing; then a moment for it to be back in its long-poll."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        workers = user.get("/workers").json()
        if workers and all(not w["running_attempts"] for w in workers):
            time.sleep(1.0)
            return
        time.sleep(0.1)
    raise TimeoutError("the agent did not become idle")


def bench_agent(args: Any, root: Path, nodes: int = 1) -> list[float]:
    """POST /jobs -> torchrun started on every node (one agent per node, all long-polling)."""
    workspace = make_workspace(args.workspace or root / "workspace")
    # Short leases: heartbeats (a third of a lease) carry cancel orders, so each job ends quickly.
    server = start_flightdeck(root / f"flightdeck-{nodes}", env={"FLIGHTDECK_LEASE_SECONDS": "3"})
    agents: list[Server] = []
    try:
        for rank in range(nodes):
            name = f"dispatch-agent-{nodes}-{rank}"
            agents.append(start_agent(server, workspace, root / f"{name}.log", name))
        recipe = dispatch_recipe(args.max_steps, nodes)
        latencies = []
        with server.client(server.user_token) as user:
            _wait_agent_idle(user)
            # Not counted: an agent's first launch imports the host checks (torch) once, seconds here.
            for index in range(-args.warmup, args.jobs):
                _wait_agent_idle(user)
                for agent in agents:
                    wait_idle(agent.pid, threshold=10.0, quiet_seconds=0.5, timeout=60)
                with contextlib.ExitStack() as stack:
                    watches = [stack.enter_context(ChildWatch(agent.pid)) for agent in agents]
                    answer = user.post("/jobs", json={**recipe, "name": f"dispatch-{nodes}-{index}"})
                    returned = time.perf_counter()
                    answer.raise_for_status()
                    started = max(watch.torchrun_started(timeout=60) for watch in watches)
                job_id = int(answer.json()["id"])
                elapsed = (started - returned) * 1e3
                if index >= 0:
                    latencies.append(elapsed)
                label = f"job {index + 1}" if index >= 0 else "warm-up job"
                where = "on every node" if nodes > 1 else ""
                print(f"{nodes} node(s), {label}: torchrun started {where} {elapsed:.0f} ms after POST /jobs")
                if not args.let_run:
                    user.post(f"/jobs/{job_id}/cancel")
                _wait_job(user, job_id, TERMINAL, timeout=300)
        return latencies
    finally:
        for agent in agents:
            stop_process(agent.pid, grace=20)
        server.stop()


def _long_poll(worker: Any, worker_id: int, claimed: dict[str, float]) -> None:
    answer = worker.post(f"/workers/{worker_id}/claim", params={"wait": 30}, json={})
    claimed["at"] = time.perf_counter()
    answer.raise_for_status()


def bench_claim_only(args: Any, root: Path) -> list[float]:
    """No agent: a client long-polls the claim route and notes when the claim answers."""
    server = start_flightdeck(root / "flightdeck", env={"FLIGHTDECK_LEASE_SECONDS": "3600"})
    try:
        latencies = []
        with server.client(server.user_token) as user, server.client(server.worker_token) as worker:
            worker_id = register_worker(worker, "dispatch-claimer")
            for index in range(args.jobs):
                claimed: dict[str, float] = {}
                poller = threading.Thread(target=_long_poll, args=(worker, worker_id, claimed))
                poller.start()
                time.sleep(0.3)  # the claim is waiting before the job is submitted
                answer = user.post(
                    "/jobs", json={**dispatch_recipe(args.max_steps), "name": f"claim-{index}"}
                )
                returned = time.perf_counter()
                answer.raise_for_status()
                poller.join(60)
                latencies.append((claimed["at"] - returned) * 1e3)
                print(f"job {index + 1}: claim answered {latencies[-1]:.1f} ms after POST /jobs", flush=True)
        return latencies
    finally:
        server.stop()


def run(
    reps: Reps = 1,
    no_mlflow: NoMlflow = False,
    results_dir: ResultsDir = RESULTS_DIR,
    client: ClientKind = "lean",
    work_dir: WorkDir = None,
    jobs: Annotated[int, typer.Option(help="jobs dispatched, one at a time")] = 20,
    claim_only: Annotated[
        bool, typer.Option("--claim-only", help="measure up to the claim answering")
    ] = False,
    max_steps: Annotated[int, typer.Option(help="training steps of each job")] = 5,
    warmup: Annotated[int, typer.Option(help="jobs run first and not counted")] = 1,
    let_run: Annotated[
        bool, typer.Option("--let-run", help="let each job train instead of cancelling it")
    ] = False,
    workspace: Annotated[Path | None, typer.Option(help="reuse a workspace with the tiny model")] = None,
    nodes: Annotated[
        str,
        typer.Option(help="comma-separated node counts, one series each (2: a gang of two agents, one job)"),
    ] = "1",
    executor: Annotated[
        str,
        typer.Option(
            help="'agent' (own agents), or 'slurm': the Slurm executor on the tests' real cluster, beside "
            "the own agent's one-node series (needs root and Slurm: scripts/install-slurm.sh)"
        ),
    ] = "agent",
) -> dict[str, Any]:
    args = SimpleNamespace(**locals())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.executor == "slurm":
        return run_slurm(args)
    if args.executor != "agent":
        raise typer.BadParameter(f"{args.executor!r}: use 'agent' or 'slurm'", param_hint="--executor")
    counts = [int(n) for n in str(args.nodes).split(",") if n.strip()]
    series: dict[int, list[float]] = {n: [] for n in counts}
    with scratch_dir(args.work_dir, "dispatch") as root:
        for _ in range(args.reps):
            for count in counts:
                if args.claim_only:
                    series[count].extend(bench_claim_only(args, root))
                else:
                    series[count].extend(bench_agent(args, root, count))
    what = "claim answered" if args.claim_only else "torchrun started"
    first = series[counts[0]]
    result = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "measured_until": what,
        "dispatch_ms": summary(first),
        "latencies_ms": first,
        "by_nodes": {str(n): {"dispatch_ms": summary(v), "latencies_ms": v} for n, v in series.items()},
    }
    table = Table()
    for count, latencies in series.items():
        figures = summary(latencies)
        where = f" on all {count} nodes" if count > 1 else ""
        table.add(
            f"POST /jobs -> {what}{where}", figures["median"], figures["min"], figures["max"], figures["p99"]
        )
    table.print(("dispatch", "p50 ms", "min", "max", "p99"))
    if len(counts) > 1 and summary(first)["median"]:
        for count in counts[1:]:
            ratio = summary(series[count])["median"] / summary(first)["median"]
            print(f"{count} nodes / {counts[0]} node p50: {ratio:.2f}x")
    write_results("dispatch", result, args.results_dir)
    return result


def run_slurm(args: Any) -> dict[str, Any]:
    """The own agent's one-node series, then the Slurm executor's, in one command; their ratio."""
    from bench.dispatch_slurm import bench_slurm

    series: dict[str, list[float]] = {"agent": [], "slurm": []}
    with scratch_dir(args.work_dir, "dispatch") as root:
        for _ in range(args.reps):
            series["agent"].extend(bench_agent(args, root, 1))
            series["slurm"].extend(bench_slurm(args, root))
    result = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "measured_until": "torchrun started",
        "dispatch_ms": summary(series["slurm"]),
        "latencies_ms": series["slurm"],
        "by_executor": {name: {"dispatch_ms": summary(v), "latencies_ms": v} for name, v in series.items()},
    }
    table = Table()
    for name, label in (("agent", "own agent"), ("slurm", "Slurm executor (sbatch, srun, runner)")):
        figures = summary(series[name])
        table.add(
            f"POST /jobs -> torchrun started, {label}",
            figures["median"],
            figures["min"],
            figures["max"],
            figures["p99"],
        )
    table.print(("dispatch", "p50 ms", "min", "max", "p99"))
    if summary(series["agent"])["median"]:
        ratio = summary(series["slurm"])["median"] / summary(series["agent"])["median"]
        print(f"Slurm executor / own agent p50: {ratio:.2f}x")
    write_results("dispatch", result, args.results_dir)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
