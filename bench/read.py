"""Metric reads: a 10,000-step series against MLflow get-history, and a 1,000,000-point downsampled view.

Run: `python -m bench.read` (add `--no-mlflow` to skip the comparison). Both servers run side by side
and the repetitions alternate between them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import httpx
import orjson
import typer

from bench.harness import (
    RESULTS_DIR,
    ClientKind,
    Databases,
    DatabasesOption,
    HttpClient,
    MlflowRest,
    NoMlflow,
    Reps,
    ResultsDir,
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


def _fill(worker: httpx.Client, attempt_id: int, steps: int, keys: list[str]) -> None:
    """`steps` steps of every key through the ingestion endpoint, in 1,000-point batches."""
    per_batch = max(1, 1000 // len(keys))
    for first in range(0, steps, per_batch):
        post_metrics(worker, attempt_id, metrics_body(first, min(per_batch, steps - first), keys))


def _fill_mlflow(rest: MlflowRest, run_id: str, steps: int, keys: list[str]) -> None:
    per_batch = max(1, 1000 // len(keys))
    for first in range(0, steps, per_batch):
        body = mlflow_batch_body(run_id, first, min(per_batch, steps - first), keys)
        rest.http.post(
            "/runs/log-batch", content=body, headers={"content-type": "application/json"}
        ).raise_for_status()


class Reads:
    """Repeated GETs of one URL: latencies per repetition, each answer checked."""

    def __init__(
        self,
        label: str,
        client: HttpClient,
        path: str,
        params: dict[str, Any],
        requests: int,
        check: Callable[[dict[str, Any]], None],
    ):
        self.label, self.client, self.path, self.params = label, client, path, params
        self.requests, self.check = requests, check
        self.p50s: list[float] = []
        self.every: list[float] = []

    def rep(self, number: int) -> None:
        latencies = []
        for _ in range(self.requests):
            start = time.perf_counter()
            answer = self.client.get(self.path, params=self.params)
            answer.raise_for_status()
            body = orjson.loads(answer.content)  # a fast parser, as a browser's JSON.parse is
            latencies.append((time.perf_counter() - start) * 1e3)
            self.check(body)
        self.every.extend(latencies)
        self.p50s.append(summary(latencies)["median"])
        print(f"{self.label} rep {number}: p50 {self.p50s[-1]:.1f} ms", flush=True)

    def figures(self) -> dict[str, Any]:
        return {"p50_ms": summary(self.p50s), "all_ms": summary(self.every)}


def flightdeck_reads(
    args: Any, root: Path, stack: contextlib.ExitStack, database: str, databases: Databases
) -> tuple[Reads, Reads]:
    server = start_flightdeck(root / f"flightdeck-{database}", env=databases.env(database))
    stack.callback(server.stop)
    keys = metric_keys(args.keys)
    series_run = claimed_attempt(server, "series")
    big_run = claimed_attempt(server, "big")
    with server.client(series_run.token) as worker, server.client(big_run.token) as big_worker:
        _fill(worker, series_run.attempt_id, args.steps, keys)
        start = time.perf_counter()
        _fill(big_worker, big_run.attempt_id, args.big_points // args.keys, keys)
        print(
            f"flightdeck ({database}) stored {args.big_points:,} points in {time.perf_counter() - start:.1f} s",
            flush=True,
        )

    def series_ok(body: dict[str, Any]) -> None:
        assert len(body["steps"]) == args.steps, f"expected {args.steps} steps, got {len(body['steps'])}"

    def view_ok(body: dict[str, Any]) -> None:
        series = body["series"]
        assert sum(s["points"] for s in series.values()) == args.big_points, "the view lost points"
        assert all(len(s["steps"]) <= args.buckets for s in series.values())

    user = stack.enter_context(server.timed_client(server.user_token, args.client))
    series = Reads(
        f"flightdeck ({database}) series",
        user,
        f"/jobs/{series_run.job_id}/metrics/series/loss",
        {},
        args.requests,
        series_ok,
    )
    view = Reads(
        f"flightdeck ({database}) downsampled",
        user,
        f"/jobs/{big_run.job_id}/metrics/downsampled",
        {"buckets": args.buckets},
        args.requests,
        view_ok,
    )
    return series, view


def mlflow_reads(args: Any, root: Path, stack: contextlib.ExitStack) -> Reads:
    server = start_mlflow(root / "mlflow")
    stack.callback(server.stop)
    rest = MlflowRest(server.url, args.client)
    stack.callback(rest.close)
    run_id = rest.new_run("read")
    start = time.perf_counter()
    _fill_mlflow(rest, run_id, args.steps, metric_keys(args.keys))
    print(
        f"mlflow stored {args.steps * args.keys:,} points in {time.perf_counter() - start:.1f} s", flush=True
    )

    def history_ok(body: dict[str, Any]) -> None:
        assert len(body["metrics"]) == args.steps, f"expected {args.steps}, got {len(body['metrics'])}"

    return Reads(
        "mlflow get-history",
        rest.http,
        "/metrics/get-history",
        {"run_id": run_id, "metric_key": "loss"},
        args.mlflow_requests,
        history_ok,
    )


def run(
    reps: Reps = 5,
    no_mlflow: NoMlflow = False,
    results_dir: ResultsDir = RESULTS_DIR,
    client: ClientKind = "lean",
    work_dir: WorkDir = None,
    steps: Annotated[int, typer.Option(help="steps in the series read")] = 10_000,
    keys: Annotated[int, typer.Option(help="metrics per step")] = 10,
    big_points: Annotated[int, typer.Option(help="points in the downsampled job")] = 1_000_000,
    buckets: Annotated[int, typer.Option(help="buckets asked of the downsampled view")] = 1000,
    requests: Annotated[int, typer.Option(help="GETs per repetition")] = 30,
    mlflow_requests: Annotated[int, typer.Option(help="MLflow GETs per repetition")] = 3,
    databases: DatabasesOption = "sqlite,postgres",
) -> dict[str, Any]:
    args = SimpleNamespace(**locals())
    with scratch_dir(args.work_dir, "read") as root, contextlib.ExitStack() as stack:
        databases = stack.enter_context(Databases(args.databases))
        # MLflow first: it must be idle before anything is measured, and it then waits idle.
        history = None if args.no_mlflow else mlflow_reads(args, root, stack)
        reads = {kind: flightdeck_reads(args, root, stack, kind, databases) for kind in databases.kinds}
        for rep in range(1, args.reps + 1):
            for series, view in reads.values():
                series.rep(rep)
                view.rep(rep)
            if history:
                history.rep(rep)
        ours = {kind: {"series": s.figures(), "downsampled": v.figures()} for kind, (s, v) in reads.items()}
        theirs = {"series": history.figures()} if history else None
    result: dict[str, Any] = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "flightdeck": ours,
        "mlflow": theirs,
        "ratio": {},
    }
    table = Table()
    rows = []
    for kind, figures in ours.items():
        rows.append((f"flightdeck ({kind}) series {args.steps:,} steps", figures["series"]))
        rows.append((f"flightdeck ({kind}) downsampled {args.big_points:,} points", figures["downsampled"]))
        if theirs:
            mine = figures["series"]["p50_ms"]["median"]
            result["ratio"][kind] = ratio(theirs["series"]["p50_ms"]["median"], mine)
    if theirs:
        rows.append((f"mlflow get-history {args.steps:,} steps", theirs["series"]))
    for name, figures in rows:
        p50 = figures["p50_ms"]
        table.add(name, p50["median"], p50["min"], p50["max"], figures["all_ms"]["p99"])
    table.print(("read", "p50 ms median", "min", "max", "p99 ms"))
    for kind, value in result["ratio"].items():
        print(f"ratio mlflow / flightdeck ({kind}) series p50: {value:.1f}x", flush=True)
    write_results("read", result, args.results_dir)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
