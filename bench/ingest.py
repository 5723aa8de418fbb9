"""Metric ingestion: 1,000-point batches through POST /attempts/{id}/metrics, against MLflow log-batch.

Run: `python -m bench.ingest` (add `--no-mlflow` to skip the comparison). Both servers run side by
side and the repetitions alternate between them, so load from elsewhere hits both alike.
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from bench.harness import (
    RESULTS_DIR,
    ClientKind,
    Databases,
    DatabasesOption,
    MlflowRest,
    NoMlflow,
    Reps,
    ResultsDir,
    RssSampler,
    Table,
    WorkDir,
    claimed_attempt,
    metric_keys,
    metrics_body,
    mlflow_batch_body,
    post_metrics,
    ratio,
    run_cli,
    scratch_dir,
    start_flightdeck,
    start_mlflow,
    summary,
    write_results,
)

Sender = Callable[[int, bytes], None]


def _send(bodies: list[bytes], clients: int, send_one: Sender) -> tuple[float, list[float]]:
    """Send every body, `clients` at a time; return the wall time and each request's latency."""
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(index: int, share: list[bytes]) -> None:
        local = []
        for body in share:
            start = time.perf_counter()
            send_one(index, body)
            local.append(time.perf_counter() - start)
        with lock:
            latencies.extend(local)

    shares = [bodies[i::clients] for i in range(clients)]
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients), shares))
    return time.perf_counter() - start, latencies


class Peer(abc.ABC):
    """One server under test: fresh steps each repetition, rates and latencies kept."""

    name = ""

    def __init__(self, args: Any, batches: int):
        self.args = args
        self.batches = batches
        self.keys = metric_keys(args.keys)
        self.next_step = 0
        self.rates: list[float] = []
        self.latencies: list[float] = []

    @abc.abstractmethod
    def body(self, first_step: int) -> bytes:
        """A request body with `steps_per_batch` steps from `first_step`."""

    @abc.abstractmethod
    def send_one(self, client: int, body: bytes) -> None:
        """Send one body with client number `client`."""

    def rep(self, number: int) -> None:
        steps = self.args.steps_per_batch
        bodies = [self.body(self.next_step + i * steps) for i in range(self.batches)]  # built before timing
        self.next_step += self.batches * steps
        wall, latencies = _send(bodies, self.args.clients, self.send_one)
        self.rates.append(self.batches * steps * self.args.keys / wall)
        self.latencies.extend(latencies)
        print(
            f"{self.name} rep {number}: {self.rates[-1]:,.0f} points/s, "
            f"p50 {summary(latencies)['median'] * 1e3:.1f} ms per request",
            flush=True,
        )

    def figures(self) -> dict[str, Any]:
        return {
            "points_per_second": summary(self.rates),
            "request_ms": {k: v * 1e3 if k != "n" else v for k, v in summary(self.latencies).items()},
        }


class FlightdeckPeer(Peer):
    def __init__(
        self, args: Any, root: Path, stack: contextlib.ExitStack, database: str, databases: Databases
    ):
        super().__init__(args, args.batches)
        self.database = database
        self.name = f"flightdeck ({database})"
        server = start_flightdeck(root / f"flightdeck-{database}", env=databases.env(database))
        stack.callback(server.stop)
        self.attempt = claimed_attempt(server)
        self.clients = [
            stack.enter_context(server.timed_client(self.attempt.token, args.client))
            for _ in range(args.clients)
        ]
        self.rss = stack.enter_context(RssSampler(server.pid))

    def body(self, first_step: int) -> bytes:
        return metrics_body(first_step, self.args.steps_per_batch, self.keys)

    def send_one(self, client: int, body: bytes) -> None:
        answer = post_metrics(self.clients[client], self.attempt.attempt_id, body)
        expected = self.args.steps_per_batch * self.args.keys
        if answer["accepted"] != expected:
            raise RuntimeError(f"expected {expected} new points, the service answered {answer}")

    def check_idempotency(self) -> None:
        """The first batch again must come back as duplicates only."""
        answer = post_metrics(self.clients[0], self.attempt.attempt_id, self.body(0))
        if answer["duplicates"] != self.args.steps_per_batch * self.args.keys:
            raise RuntimeError(f"a resent batch was not recognised as duplicates: {answer}")

    def figures(self) -> dict[str, Any]:
        return {**super().figures(), "rss_peak_mb": self.rss.peak_mb, "rss_samples": len(self.rss.samples)}


class MlflowPeer(Peer):
    name = "mlflow"

    def __init__(self, args: Any, root: Path, stack: contextlib.ExitStack):
        super().__init__(args, args.mlflow_batches)
        server = start_mlflow(root / "mlflow")
        stack.callback(server.stop)
        self.rest = MlflowRest(server.url, args.client)
        stack.callback(self.rest.close)
        self.run_id = self.rest.new_run("ingest")

    def body(self, first_step: int) -> bytes:
        return mlflow_batch_body(self.run_id, first_step, self.args.steps_per_batch, self.keys)

    def send_one(self, client: int, body: bytes) -> None:
        self.rest.http.post(
            "/runs/log-batch", content=body, headers={"content-type": "application/json"}
        ).raise_for_status()


@contextlib.contextmanager
def peers(args: Any, root: Path) -> Iterator[tuple[list[FlightdeckPeer], MlflowPeer | None]]:
    with contextlib.ExitStack() as stack:
        databases = stack.enter_context(Databases(args.databases))
        # MLflow first: it must be idle before anything is measured, and it then waits idle.
        theirs = None if args.no_mlflow else MlflowPeer(args, root, stack)
        yield [FlightdeckPeer(args, root, stack, kind, databases) for kind in databases.kinds], theirs


def run(
    reps: Reps = 5,
    no_mlflow: NoMlflow = False,
    results_dir: ResultsDir = RESULTS_DIR,
    # The client shares the service's two cores: the lightest one measures the servers, not itself
    # (SocketClient; bench/README.md has the figures with LeanClient alongside).
    client: ClientKind = "socket",
    work_dir: WorkDir = None,
    batches: Annotated[int, typer.Option(help="requests per repetition")] = 300,
    mlflow_batches: Annotated[int, typer.Option(help="MLflow requests per repetition")] = 20,
    steps_per_batch: Annotated[int, typer.Option(help="steps in one request")] = 100,
    keys: Annotated[int, typer.Option(help="metrics per step (points per step)")] = 10,
    clients: Annotated[int, typer.Option(help="concurrent client threads")] = 1,
    databases: DatabasesOption = "sqlite,postgres",
) -> dict[str, Any]:
    args = SimpleNamespace(**locals())
    with scratch_dir(args.work_dir, "ingest") as root, peers(args, root) as (ours, theirs):
        for rep in range(1, args.reps + 1):  # the peers take turns, so load from elsewhere hits all alike
            for peer in ours:
                peer.rep(rep)
            if theirs:
                theirs.rep(rep)
        for peer in ours:
            peer.check_idempotency()
        mine = {peer.database: peer.figures() for peer in ours}
        other = theirs.figures() if theirs else None
    result: dict[str, Any] = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "flightdeck": mine,
        "mlflow": other,
        "ratio": {},
    }
    table = Table()
    for database, figures in mine.items():
        rate = figures["points_per_second"]
        table.add(
            f"flightdeck ({database})",
            rate["median"],
            rate["min"],
            rate["max"],
            figures["request_ms"]["median"],
            figures["rss_peak_mb"],
        )
        if other:
            result["ratio"][database] = ratio(rate["median"], other["points_per_second"]["median"])
    if other:
        theirs_rate = other["points_per_second"]
        table.add(
            "mlflow",
            theirs_rate["median"],
            theirs_rate["min"],
            theirs_rate["max"],
            other["request_ms"]["median"],
            "-",
        )
    table.print(("ingest", "points/s median", "min", "max", "request p50 ms", "service RSS peak MB"))
    for database, value in result["ratio"].items():
        print(f"ratio flightdeck ({database}) / mlflow: {value:.1f}x", flush=True)
    write_results("ingest", result, args.results_dir)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
