"""Metric ingestion: 1,000-point batches through POST /attempts/{id}/metrics, against MLflow log-batch.

Run: `python -m bench.ingest` (add `--no-mlflow` to skip the comparison).
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.harness import (
    MlflowRest,
    RssSampler,
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


def _send(bodies: list[bytes], clients: int, send_one: Any) -> tuple[float, list[float]]:
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


def bench_flightdeck(args: Any, root: Any) -> dict[str, Any]:
    server = start_flightdeck(root / "flightdeck")
    keys = metric_keys(args.keys)
    points_per_batch = args.steps_per_batch * args.keys
    try:
        attempt = claimed_attempt(server)
        clients = [server.client(server.worker_token) for _ in range(args.clients)]

        def send_one(index: int, body: bytes) -> None:
            answer = post_metrics(clients[index], attempt.attempt_id, body)
            if answer["accepted"] != points_per_batch:
                raise RuntimeError(f"expected {points_per_batch} new points, the service answered {answer}")

        rates, latencies, step = [], [], 0
        with RssSampler(server.pid) as rss:
            for rep in range(args.reps):
                bodies = [
                    metrics_body(step + i * args.steps_per_batch, args.steps_per_batch, keys)
                    for i in range(args.batches)
                ]
                step += args.batches * args.steps_per_batch
                wall, lat = _send(bodies, args.clients, send_one)
                rates.append(args.batches * points_per_batch / wall)
                latencies.extend(lat)
                print(
                    f"flightdeck rep {rep + 1}: {rates[-1]:,.0f} points/s, "
                    f"p50 {summary(lat)['median'] * 1e3:.1f} ms per request",
                    flush=True,
                )
            # Idempotency under load: the first batch again must be all duplicates.
            again = post_metrics(clients[0], attempt.attempt_id, metrics_body(0, args.steps_per_batch, keys))
        for client in clients:
            client.close()
        if again["duplicates"] != points_per_batch:
            raise RuntimeError(f"a resent batch was not recognised as duplicates: {again}")
        return {
            "points_per_second": summary(rates),
            "request_ms": {k: v * 1e3 if k != "n" else v for k, v in summary(latencies).items()},
            "rss_peak_mb": rss.peak_mb,
            "rss_samples": len(rss.samples),
        }
    finally:
        server.stop()


def bench_mlflow(args: Any, root: Any) -> dict[str, Any]:
    server = start_mlflow(root / "mlflow")
    keys = metric_keys(args.keys)
    try:
        rest = MlflowRest(server.url)
        run_id = rest.new_run("ingest")
        rates, latencies, step = [], [], 0
        for rep in range(args.reps):
            bodies = [
                mlflow_batch_body(run_id, step + i * args.steps_per_batch, args.steps_per_batch, keys)
                for i in range(args.mlflow_batches)
            ]
            step += args.mlflow_batches * args.steps_per_batch

            def send_one(_: int, body: bytes) -> None:
                rest.http.post(
                    "/runs/log-batch", content=body, headers={"content-type": "application/json"}
                ).raise_for_status()

            wall, lat = _send(bodies, 1, send_one)
            rates.append(args.mlflow_batches * args.steps_per_batch * args.keys / wall)
            latencies.extend(lat)
            print(
                f"mlflow rep {rep + 1}: {rates[-1]:,.0f} points/s, "
                f"p50 {summary(lat)['median'] * 1e3:.1f} ms per request",
                flush=True,
            )
        rest.close()
        return {
            "points_per_second": summary(rates),
            "request_ms": {k: v * 1e3 if k != "n" else v for k, v in summary(latencies).items()},
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300, help="requests per repetition")
    parser.add_argument("--mlflow-batches", type=int, default=20, help="MLflow requests per repetition")
    parser.add_argument("--steps-per-batch", type=int, default=100)
    parser.add_argument("--keys", type=int, default=10, help="metrics per step (points per step)")
    parser.add_argument("--clients", type=int, default=1, help="concurrent client threads")
    args = parser.parse_args(argv)
    with work_dir(args.work_dir, "ingest") as root:
        ours = bench_flightdeck(args, root)
        theirs = None if args.no_mlflow else bench_mlflow(args, root)
    result: dict[str, Any] = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "flightdeck": ours,
        "mlflow": theirs,
    }
    table = Table()
    table.add(
        "flightdeck",
        ours["points_per_second"]["median"],
        ours["points_per_second"]["min"],
        ours["points_per_second"]["max"],
        ours["request_ms"]["median"],
        ours["rss_peak_mb"],
    )
    if theirs:
        result["ratio"] = ratio(ours["points_per_second"]["median"], theirs["points_per_second"]["median"])
        table.add(
            "mlflow",
            theirs["points_per_second"]["median"],
            theirs["points_per_second"]["min"],
            theirs["points_per_second"]["max"],
            theirs["request_ms"]["median"],
            "-",
        )
    table.print(("ingest", "points/s median", "min", "max", "request p50 ms", "service RSS peak MB"))
    if theirs:
        print(f"ratio flightdeck / mlflow: {result['ratio']:.1f}x", flush=True)
    write_results("ingest", result, args.results_dir)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
