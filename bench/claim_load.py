"""Claims under realistic load: a fleet of registered agents claiming now and then, and all at once.

`python -m bench.claim --load realistic` (bench/claim.py) runs, for each database and each claim path
(`--paths batched,plain`, the service's FLIGHTDECK_CLAIM_PATH), on one fresh service:

- **burst**: every agent claims at the same instant right after a service restart (agents whose
  long-polls the restart cut all come back together), each on a new connection;
- **steady xN**, for each factor of `--load-factors` (default 1 and 10): `--agents` agents, each
  claiming every 30-120 s (`--interval-s`, uniform) divided by the factor. Time is compressed only by
  running a window of `--duration-s` seconds of that schedule: the claims arrive at the rate the
  fleet makes (1,000 agents: 13.3 claims/s; x10: 133/s), each at its scheduled instant whatever the
  earlier ones are doing (an open loop: a slow answer does not delay the next claim's start, as it
  would with agents claiming back to back), each on a new connection (30-120 s apart an agent's
  keep-alive connection has long been closed by the server), each with the agent's own token.

Latency is from a claim's scheduled instant to its answer, so time a claim spent waiting for a free
sender thread counts against the service, never for it. Every claim finds a queued job (the queue is
filled for the whole run first): the costly answer, not the 204 of an empty queue.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.harness import (
    Databases,
    Flightdeck,
    SocketClient,
    Table,
    start_flightdeck,
    summary,
)

# Open-loop senders: enough that a claim's start never waits for an earlier answer at 10x load
# (133 claims/s at tens of ms each keeps a handful busy).
SENDERS = 64


def _claim(server: Flightdeck, worker_id: int, token: str) -> int | None:
    """One claim on a new connection, as an agent whose previous connection timed out; the job id."""
    client = SocketClient(server.url, {"Authorization": f"Bearer {token}"})
    try:
        answer = client.post(f"/workers/{worker_id}/claim", json={})
    finally:
        client.close()
    if answer.status_code == 204:
        return None
    answer.raise_for_status()
    return int(answer.json()["attempt"]["job_id"])


def _register_fleet(server: Flightdeck, agents: int) -> list[tuple[int, str]]:
    """Each agent registers once with the enrolment token; its id and its own token."""

    def one(index: int) -> tuple[int, str]:
        inventory = {"gpus": [], "cpu_slots": 1, "cores": 8, "hostname": f"agent-{index:05d}"}
        with SocketClient(server.url, {"Authorization": f"Bearer {server.worker_token}"}) as client:
            answer = client.post("/workers", json={"name": f"agent-{index:05d}", "inventory": inventory})
        answer.raise_for_status()
        return int(answer.json()["id"]), str(answer.json()["token"])

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(agents)))


def _queue(server: Flightdeck, jobs: int) -> None:
    from bench.claim import _submit_all  # the back-to-back benchmark's own submission

    _submit_all(server, jobs, 4)


def schedule(
    agents: int, interval: tuple[float, float], factor: float, duration: float, seed: int
) -> list[tuple[float, int]]:
    """(instant, agent index) of every claim in the window: each agent claims every uniform(interval) /
    factor seconds, and the window opens at a random point of its current interval (a fleet that has
    been running a while, not one started in step): that interval is drawn length-biased (a long one
    is more likely to hold a given instant), the point uniformly in it. The fleet's rate is then
    agents / mean interval from the first second (1,000 agents, 30-120 s: 13.3 claims/s)."""
    rng = random.Random(seed)
    low, high = interval[0] / factor, interval[1] / factor
    claims = []
    for agent in range(agents):
        current = math.sqrt(low**2 + rng.random() * (high**2 - low**2))  # density proportional to length
        at = rng.uniform(0, current)
        while at < duration:
            claims.append((at, agent))
            at += rng.uniform(low, high)
    return sorted(claims)


def _steady(
    server: Flightdeck, fleet: list[tuple[int, str]], planned: list[tuple[float, int]]
) -> dict[str, Any]:
    latencies: list[float] = []
    claimed: list[int | None] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.5

    def send(item: tuple[float, int]) -> None:
        at, agent = item
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        worker_id, token = fleet[agent]
        try:
            job = _claim(server, worker_id, token)
        except Exception as exc:  # counted, not raised: one refused connection must not hide the rest
            with lock:
                errors.append(repr(exc)[:200])
            return
        done = time.perf_counter()
        with lock:
            latencies.append((done - (start + at)) * 1e3)
            claimed.append(job)

    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(send, planned))
    wall = time.perf_counter() - start
    return {"latencies": latencies, "claimed": claimed, "errors": errors, "wall": wall}


def _burst(server: Flightdeck, fleet: list[tuple[int, str]]) -> dict[str, Any]:
    """Every agent claims at the same instant (one thread each, released together)."""
    go = threading.Event()
    latencies: list[float] = []
    claimed: list[int | None] = []
    errors: list[str] = []
    lock = threading.Lock()
    began: list[float] = []

    def agent(worker_id: int, token: str) -> None:
        go.wait()
        try:
            job = _claim(server, worker_id, token)
        except Exception as exc:
            with lock:
                errors.append(repr(exc)[:200])
            return
        done = time.perf_counter()
        with lock:
            latencies.append((done - began[0]) * 1e3)
            claimed.append(job)

    threads = [threading.Thread(target=agent, args=member, daemon=True) for member in fleet]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # every thread waiting at the gate
    began.append(time.perf_counter())
    go.set()
    for thread in threads:
        thread.join(timeout=300)
    return {
        "latencies": latencies,
        "claimed": claimed,
        "errors": errors,
        "wall": time.perf_counter() - began[0],
    }


def _figures(name: str, run: dict[str, Any], offered: int) -> dict[str, Any]:
    jobs = [j for j in run["claimed"] if j is not None]
    twice = [j for j, n in Counter(jobs).items() if n > 1]
    if twice:
        raise RuntimeError(f"{name}: jobs claimed twice: {twice[:10]} ({len(twice)})")
    figures = summary(run["latencies"]) if run["latencies"] else {}
    return {
        "offered": offered,
        "answered": len(run["claimed"]),
        "got_a_job": len(jobs),
        "errors": len(run["errors"]),
        "first_errors": run["errors"][:3],
        "claims_per_second": len(run["claimed"]) / run["wall"],
        "p50_ms": figures.get("median"),
        "p99_ms": figures.get("p99"),
        "max_ms": figures.get("max"),
    }


def _one_service(
    args: Any, kind: str, path: str, data_dir: Path, databases: Databases, plans: dict[float, Any], need: int
) -> dict[str, Any]:
    """A fresh service and database: the fleet registers and the jobs are queued, the service restarts,
    then the burst and each steady load run on it."""
    env = {"FLIGHTDECK_LEASE_SECONDS": "3600", "FLIGHTDECK_CLAIM_PATH": path, **databases.env(kind)}
    server = start_flightdeck(data_dir, env=env)
    try:
        fleet = _register_fleet(server, args.agents)
        _queue(server, need)
    finally:
        server.stop()
    # The restart: the same database and data, a new process with cold caches and pools.
    server = start_flightdeck(data_dir, env=env)
    scenarios: dict[str, Any] = {}
    try:
        scenarios["burst"] = _figures("burst", _burst(server, fleet), args.agents)
        for factor, planned in plans.items():
            name = f"steady x{factor:g}"
            scenarios[name] = _figures(name, _steady(server, fleet, planned), len(planned))
    finally:
        server.stop()
    for name, figures in scenarios.items():
        print(
            f"  {name}: {figures['answered']:,}/{figures['offered']:,} answered ({figures['errors']} errors), "
            f"{figures['claims_per_second']:,.1f}/s, p50 {figures['p50_ms']:.1f} ms, p99 "
            f"{figures['p99_ms']:.1f} ms, max {figures['max_ms']:.1f} ms",
            flush=True,
        )
    return scenarios


def _median_of(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario: the median over repetitions of each figure, and every repetition."""
    merged: dict[str, Any] = {}
    for name in reps[0]:
        runs = [rep[name] for rep in reps]
        merged[name] = {
            **{
                k: statistics.median(r[k] for r in runs)
                for k in ("p50_ms", "p99_ms", "max_ms", "claims_per_second")
            },
            "errors": sum(r["errors"] for r in runs),
            # Every repetition offers the same schedule; the fewest answered and given a job of any.
            "offered": runs[0]["offered"],
            "answered": min(r["answered"] for r in runs),
            "got_a_job": min(r["got_a_job"] for r in runs),
            "reps": runs,
        }
    return merged


def run_realistic(args: Any, root: Path, databases: Databases) -> dict[str, Any]:
    """Every path on every database: burst, then each steady factor; one table, ratios to the first path."""
    interval = tuple(float(x) for x in args.interval_s.split(","))
    if len(interval) != 2 or not 0 < interval[0] <= interval[1]:
        raise ValueError(f"--interval-s {args.interval_s!r}: give LOW,HIGH seconds, e.g. 30,120")
    factors = [float(f) for f in args.load_factors.split(",")]
    paths = [p.strip() for p in args.paths.split(",")]
    plans = {f: schedule(args.agents, interval, f, args.duration_s, seed=int(f * 1000)) for f in factors}
    need = args.agents + sum(len(p) for p in plans.values())
    result: dict[str, Any] = {}
    table = Table()
    for kind in databases.kinds:
        runs: dict[str, list[dict[str, Any]]] = {path: [] for path in paths}
        for rep in range(args.reps):
            # The order alternates, so a machine that slows down during the command slows both paths.
            for path in paths if rep % 2 == 0 else paths[::-1]:
                print(f"{kind} {path} rep {rep + 1}:", flush=True)
                runs[path].append(
                    _one_service(
                        args, kind, path, Path(root) / f"{kind}-{path}-{rep}", databases, plans, need
                    )
                )
        result[kind] = {path: _median_of(reps) for path, reps in runs.items()}
        for name in result[kind][paths[0]]:
            base = result[kind][paths[0]][name]
            for path in paths:
                figures = result[kind][path][name]
                table.add(
                    f"{kind} {name} {path}",
                    figures["p50_ms"],
                    figures["p99_ms"],
                    figures["max_ms"],
                    figures["claims_per_second"],
                    f"{figures['p99_ms'] / base['p99_ms']:.2f}",
                )
    table.print(("claims", "p50 ms", "p99 ms", "max ms", "answered/s", f"p99 / {paths[0]}"))
    goal = max(factors)
    for kind, by_path in result.items():
        plain = by_path.get("plain", {}).get(f"steady x{goal:g}")
        if plain:
            verdict = "meets" if plain["p99_ms"] <= 50 and not plain["errors"] else "misses"
            print(f"{kind}: the plain path {verdict} p99 <= 50 ms at x{goal:g} ({plain['p99_ms']:.1f} ms)")
    return result
