"""Claims at scale: many queued jobs, many agents claiming at once; each job must be claimed exactly once.

Run: `python -m bench.claim` (50 agents back to back), `python -m bench.claim --load realistic` (a
fleet claiming every 30-120 s, ten times that, and a burst: bench/claim_load.py). `--paths
batched,plain` runs each claim path (FLIGHTDECK_CLAIM_PATH) side by side in the one command.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

import typer

from bench.claim_load import run_realistic
from bench.harness import (
    RESULTS_DIR,
    ClientKind,
    CpuMeter,
    Databases,
    DatabasesOption,
    Flightdeck,
    NoMlflow,
    Reps,
    ResultsDir,
    Table,
    WorkDir,
    register_worker,
    run_cli,
    scratch_dir,
    start_flightdeck,
    submit_job,
    summary,
    write_results,
)


def _submit_all(server: Flightdeck, jobs: int, threads: int) -> list[int]:
    """Queue `jobs` jobs through POST /jobs, a few at a time."""
    local = threading.local()

    def submit(index: int) -> int:
        if not hasattr(local, "client"):
            local.client = server.client(server.user_token)
        return submit_job(local.client, f"claim-{index}")

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(submit, range(jobs)))


def _claim_until_empty(
    server: Flightdeck, name: str, think: float, stop: threading.Event, client: str
) -> dict[str, Any]:
    """One agent: claim (no waiting) until the queue answers 204; each claim's latency and job."""
    latencies: list[float] = []
    claimed: list[int] = []
    # Paced agents are not in lock-step, as a fleet finishing jobs at different times is not.
    rng = random.Random(name)
    with server.timed_client(server.worker_token, client) as worker:
        worker_id = register_worker(worker, name)
        stop.wait()  # every agent starts together (paced ones within one pause)
        time.sleep(rng.uniform(0, think))
        while True:
            start = time.perf_counter()
            answer = worker.post(f"/workers/{worker_id}/claim", json={})
            elapsed = time.perf_counter() - start
            if answer.status_code == 204:
                break
            answer.raise_for_status()
            latencies.append(elapsed)
            claimed.append(int(answer.json()["attempt"]["job_id"]))
            if think:
                time.sleep(rng.uniform(0.5, 1.5) * think)
    return {"latencies": latencies, "claimed": claimed}


def run_once(server: Flightdeck, args: Any, rep: int, database_pid: int | None = None) -> dict[str, Any]:
    start = time.perf_counter()
    queued = _submit_all(server, args.jobs, args.submit_threads)
    submitted = time.perf_counter() - start
    go = threading.Event()
    with ThreadPoolExecutor(args.clients) as pool:
        futures = [
            pool.submit(
                _claim_until_empty, server, f"claimer-{rep}-{i}", args.think_ms / 1e3, go, args.client
            )
            for i in range(args.clients)
        ]
        time.sleep(0.5)  # let every agent register before the start
        cpu = CpuMeter(server.process.pid, database_pid)
        cpu.start()
        start = time.perf_counter()
        go.set()
        agents = [f.result() for f in futures]
    wall = time.perf_counter() - start
    spent = cpu.stop()
    claimed = [job for a in agents for job in a["claimed"]]
    latencies = [s * 1e3 for a in agents for s in a["latencies"]]
    twice = [job for job, n in Counter(claimed).items() if n > 1]
    missed = set(queued) - set(claimed)
    if twice or missed:
        raise RuntimeError(f"claimed twice: {twice[:10]} ({len(twice)}), never claimed: {len(missed)}")
    figures = summary(latencies)
    cpu_ms = {part: seconds * 1e3 / len(claimed) for part, seconds in spent.items()}
    print(
        f"rep {rep + 1}: {len(claimed):,} jobs claimed once each by {args.clients} agents in {wall:.1f} s "
        f"({len(claimed) / wall:,.0f}/s); claim p50 {figures['median']:.1f} ms, p99 {figures['p99']:.1f} ms "
        f"(queued in {submitted:.1f} s); CPU per claim: "
        + ", ".join(
            f"{part} {ms:.2f} ms" for part, ms in cpu_ms.items() if part != "database" or database_pid
        ),
        flush=True,
    )
    return {
        "claim_ms": figures,
        "claims_per_second": len(claimed) / wall,
        "submit_seconds": submitted,
        "cpu_ms_per_claim": cpu_ms,
    }


def run(
    reps: Reps = 3,
    no_mlflow: NoMlflow = False,
    results_dir: ResultsDir = RESULTS_DIR,
    # The agents share the service's two cores: the lightest client leaves them to the service (SocketClient).
    client: ClientKind = "socket",
    work_dir: WorkDir = None,
    jobs: Annotated[int, typer.Option(help="jobs queued before the agents start")] = 10_000,
    clients: Annotated[int, typer.Option(help="concurrent claiming agents (threads)")] = 50,
    think_ms: Annotated[
        float, typer.Option(help="mean pause of an agent between claims (0.5-1.5x, random)")
    ] = 0.0,
    submit_threads: Annotated[int, typer.Option(help="threads queueing the jobs")] = 4,
    databases: DatabasesOption = "sqlite,postgres",
    paths: Annotated[
        str, typer.Option(help="claim paths to compare (FLIGHTDECK_CLAIM_PATH), the first is the baseline")
    ] = "batched",
    load: Annotated[
        Literal["back-to-back", "realistic"],
        typer.Option(help="back-to-back: --clients agents drain --jobs; realistic: bench/claim_load.py"),
    ] = "back-to-back",
    agents: Annotated[int, typer.Option(help="realistic: registered agents")] = 1000,
    interval_s: Annotated[
        str, typer.Option(help="realistic: LOW,HIGH seconds between an agent's claims")
    ] = "30,120",
    load_factors: Annotated[
        str, typer.Option(help="realistic: steady loads, as multiples of the fleet's")
    ] = "1,10",
    duration_s: Annotated[
        float, typer.Option(help="realistic: seconds of each steady load's schedule")
    ] = 20.0,
) -> dict[str, Any]:
    args = SimpleNamespace(**locals())
    result: dict[str, Any] = {"config": {k: str(v) for k, v in vars(args).items()}, "databases": {}}
    unknown = [p for p in args.paths.split(",") if p.strip() not in ("batched", "plain")]
    if unknown:
        raise typer.BadParameter(f"--paths: {unknown}; use batched, plain or batched,plain")
    table = Table()
    with scratch_dir(args.work_dir, "claim") as root, Databases(args.databases) as databases:
        if args.load == "realistic":
            result["databases"] = run_realistic(args, root, databases)
            write_results("claim-realistic", result, args.results_dir)
            return result
        for kind in databases.kinds:
            for path in [p.strip() for p in args.paths.split(",")]:
                runs = []
                for rep in range(args.reps):
                    # A fresh service and database per repetition: every repetition starts from the same
                    # queue. Long leases: no attempt may expire and be requeued while agents claim.
                    env = {
                        "FLIGHTDECK_LEASE_SECONDS": "3600",
                        "FLIGHTDECK_CLAIM_PATH": path,
                        **databases.env(kind),
                    }
                    server = start_flightdeck(Path(root) / f"{kind}-{path}-rep-{rep}", env=env)
                    try:
                        print(f"{kind} {path}:", end=" ", flush=True)
                        runs.append(run_once(server, args, rep, databases.server_pid(kind)))
                    finally:
                        server.stop()
                figures = {
                    "p99_ms": summary([r["claim_ms"]["p99"] for r in runs]),
                    "p50_ms": summary([r["claim_ms"]["median"] for r in runs]),
                    "claims_per_second": summary([r["claims_per_second"] for r in runs]),
                    "runs": runs,
                }
                result["databases"].setdefault(kind, {})[path] = figures
                for name in ("p50_ms", "p99_ms", "claims_per_second"):
                    table.add(
                        f"{kind} {path} {name}",
                        figures[name]["median"],
                        figures[name]["min"],
                        figures[name]["max"],
                    )
    table.print((f"claim ({args.jobs:,} jobs, {args.clients} agents)", "median", "min", "max"))
    write_results("claim", result, args.results_dir)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
