"""Metric reads: a 10,000-step series against MLflow get-history, and a 1,000,000-point downsampled view.

Run: `python -m bench.read` (add `--no-mlflow` to skip the comparison).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.harness import (
    MlflowRest,
    Table,
    base_parser,
    claimed_attempt,
    metric_keys,
    metrics_body,
    mlflow_batch_body,
    post_metrics,
    ratio,
    start_flightdeck,
    start_mlflow,
    summary,
    work_dir,
    write_results,
)

BATCH_STEPS = 100


def _fill(worker: httpx.Client, attempt_id: int, steps: int, keys: list[str]) -> None:
    """`steps` steps of every key through the ingestion endpoint, in 1,000-point batches."""
    per_batch = max(1, 1000 // len(keys))
    for first in range(0, steps, per_batch):
        post_metrics(worker, attempt_id, metrics_body(first, min(per_batch, steps - first), keys))


def _time_gets(
    client: httpx.Client, path: str, params: dict[str, Any], requests: int, check: Any
) -> list[float]:
    """Latency of `requests` sequential GETs; `check` validates each answer's JSON."""
    latencies = []
    for _ in range(requests):
        start = time.perf_counter()
        answer = client.get(path, params=params)
        answer.raise_for_status()
        body = orjson.loads(answer.content)  # a fast parser, as a browser's JSON.parse is
        latencies.append(time.perf_counter() - start)
        check(body)
    return latencies


def _reps(args: Any, label: str, run_once: Any) -> dict[str, Any]:
    """Repetitions of `run_once()` (a list of latencies): the median of per-repetition p50s, and all."""
    p50s, every = [], []
    for rep in range(args.reps):
        latencies = run_once()
        every.extend(latencies)
        p50s.append(summary(latencies)["median"] * 1e3)
        print(f"{label} rep {rep + 1}: p50 {p50s[-1]:.1f} ms", flush=True)
    return {
        "p50_ms": summary(p50s),
        "all_ms": {k: v * 1e3 if k != "n" else v for k, v in summary(every).items()},
    }


def bench_flightdeck(args: Any, root: Path) -> dict[str, Any]:
    server = start_flightdeck(root / "flightdeck")
    keys = metric_keys(args.keys)
    try:
        series_run = claimed_attempt(server, "series")
        big_run = claimed_attempt(server, "big")
        with server.client(server.worker_token) as worker:
            _fill(worker, series_run.attempt_id, args.steps, keys)
            start = time.perf_counter()
            _fill(worker, big_run.attempt_id, args.big_points // args.keys, keys)
            print(f"stored {args.big_points:,} points in {time.perf_counter() - start:.1f} s", flush=True)

        def series_ok(body: dict[str, Any]) -> None:
            assert len(body["steps"]) == args.steps, f"expected {args.steps} steps, got {len(body['steps'])}"

        def view_ok(body: dict[str, Any]) -> None:
            series = body["series"]
            assert sum(s["points"] for s in series.values()) == args.big_points, "the view lost points"
            assert all(len(s["steps"]) <= args.buckets for s in series.values())

        with server.client(server.user_token) as user:
            series = _reps(
                args,
                "series",
                lambda: _time_gets(
                    user, f"/jobs/{series_run.job_id}/metrics/series/loss", {}, args.requests, series_ok
                ),
            )
            view = _reps(
                args,
                "downsampled",
                lambda: _time_gets(
                    user,
                    f"/jobs/{big_run.job_id}/metrics/downsampled",
                    {"buckets": args.buckets},
                    args.requests,
                    view_ok,
                ),
            )
        return {"series": series, "downsampled": view}
    finally:
        server.stop()


def bench_mlflow(args: Any, root: Path) -> dict[str, Any]:
    server = start_mlflow(root / "mlflow")
    keys = metric_keys(args.keys)
    try:
        rest = MlflowRest(server.url)
        run_id = rest.new_run("read")
        per_batch = max(1, 1000 // len(keys))
        for first in range(0, args.steps, per_batch):
            body = mlflow_batch_body(run_id, first, min(per_batch, args.steps - first), keys)
            rest.http.post(
                "/runs/log-batch", content=body, headers={"content-type": "application/json"}
            ).raise_for_status()

        def history_ok(body: dict[str, Any]) -> None:
            assert len(body["metrics"]) == args.steps, f"expected {args.steps}, got {len(body['metrics'])}"

        params = {"run_id": run_id, "metric_key": "loss"}
        history = _reps(
            args,
            "mlflow get-history",
            lambda: _time_gets(rest.http, "/metrics/get-history", params, args.mlflow_requests, history_ok),
        )
        rest.close()
        return {"series": history}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps in the series read")
    parser.add_argument("--keys", type=int, default=10, help="metrics per step")
    parser.add_argument("--big-points", type=int, default=1_000_000, help="points in the downsampled job")
    parser.add_argument("--buckets", type=int, default=1000, help="buckets asked of the downsampled view")
    parser.add_argument("--requests", type=int, default=30, help="GETs per repetition")
    parser.add_argument("--mlflow-requests", type=int, default=3, help="MLflow GETs per repetition")
    args = parser.parse_args(argv)
    with work_dir(args.work_dir, "read") as root:
        ours = bench_flightdeck(args, root)
        theirs = None if args.no_mlflow else bench_mlflow(args, root)
    result: dict[str, Any] = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "flightdeck": ours,
        "mlflow": theirs,
    }
    table = Table()
    for name, figures in (
        (f"series {args.steps:,} steps", ours["series"]),
        (f"downsampled {args.big_points:,} points", ours["downsampled"]),
    ):
        p50 = figures["p50_ms"]
        table.add(f"flightdeck {name}", p50["median"], p50["min"], p50["max"], figures["all_ms"]["p99"])
    if theirs:
        p50 = theirs["series"]["p50_ms"]
        table.add(
            f"mlflow get-history {args.steps:,}",
            p50["median"],
            p50["min"],
            p50["max"],
            theirs["series"]["all_ms"]["p99"],
        )
        result["ratio"] = ratio(p50["median"], ours["series"]["p50_ms"]["median"])
    table.print(("read", "p50 ms median", "min", "max", "p99 ms"))
    if theirs:
        print(f"ratio mlflow / flightdeck series p50: {result['ratio']:.1f}x", flush=True)
    write_results("read", result, args.results_dir)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
