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


def flightdeck_reads(args: Any, root: Path, stack: contextlib.ExitStack) -> tuple[Reads, Reads]:
    server = start_flightdeck(root / "flightdeck")
    stack.callback(server.stop)
    keys = metric_keys(args.keys)
    series_run = claimed_attempt(server, "series")
    big_run = claimed_attempt(server, "big")
    with server.client(series_run.token) as worker, server.client(big_run.token) as big_worker:
        _fill(worker, series_run.attempt_id, args.steps, keys)
        start = time.perf_counter()
        _fill(big_worker, big_run.attempt_id, args.big_points // args.keys, keys)
        print(
            f"flightdeck stored {args.big_points:,} points in {time.perf_counter() - start:.1f} s", flush=True
        )

    def series_ok(body: dict[str, Any]) -> None:
        assert len(body["steps"]) == args.steps, f"expected {args.steps} steps, got {len(body['steps'])}"

    def view_ok(body: dict[str, Any]) -> None:
        series = body["series"]
        assert sum(s["points"] for s in series.values()) == args.big_points, "the view lost points"
        assert all(len(s["steps"]) <= args.buckets for s in series.values())

    user = stack.enter_context(server.timed_client(server.user_token, args.client))
    series = Reads(
        "flightdeck series",
        user,
        f"/jobs/{series_run.job_id}/metrics/series/loss",
        {},
        args.requests,
        series_ok,
    )
    view = Reads(
        "flightdeck downsampled",
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
) -> dict[str, Any]:
    args = SimpleNamespace(**locals())
    with scratch_dir(args.work_dir, "read") as root, contextlib.ExitStack() as stack:
        # MLflow first: it must be idle before anything is measured, and it then waits idle.
        history = None if args.no_mlflow else mlflow_reads(args, root, stack)
        series, view = flightdeck_reads(args, root, stack)
        for rep in range(1, args.reps + 1):
            series.rep(rep)
            if history:
                history.rep(rep)
            view.rep(rep)
        ours = {"series": series.figures(), "downsampled": view.figures()}
        theirs = {"series": history.figures()} if history else None
    result: dict[str, Any] = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "flightdeck": ours,
        "mlflow": theirs,
    }
    table = Table()
    rows = [
        (f"flightdeck series {args.steps:,} steps", ours["series"]),
        (f"flightdeck downsampled {args.big_points:,} points", ours["downsampled"]),
    ]
    if theirs:
        rows.append((f"mlflow get-history {args.steps:,} steps", theirs["series"]))
        result["ratio"] = ratio(theirs["series"]["p50_ms"]["median"], ours["series"]["p50_ms"]["median"])
    for name, figures in rows:
        p50 = figures["p50_ms"]
        table.add(name, p50["median"], p50["min"], p50["max"], figures["all_ms"]["p99"])
    table.print(("read", "p50 ms median", "min", "max", "p99 ms"))
    if theirs:
        print(f"ratio mlflow / flightdeck series p50: {result['ratio']:.1f}x", flush=True)
    write_results("read", result, args.results_dir)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
