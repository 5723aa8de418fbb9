"""Prometheus metrics for operators: GET /metrics, and the ASGI middleware that times every request.

Gauges that describe stored state (jobs by status, queue depth, running attempts, workers alive)
are read from the database at scrape time, so they are right after a restart and with several
service processes. Counters and histograms of traffic live in the process, one registry per app.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import text
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flightdeck.service.api.deps import AppState
from flightdeck.service.worker_liveness import count_alive
from flightdeck.statuses import JobStatus

CLAIM_ROUTE = "/workers/{worker_id}/claim"
METRICS_INGEST_ROUTE = "/attempts/{attempt_id}/metrics"
# Claims long-poll for up to claim_max_wait_seconds, so the buckets reach well past a second.
_CLAIM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


class StoredStateCollector(Collector):
    """Gauges computed from the tables on each scrape."""

    def __init__(self, state_of: Any):
        self._state_of = state_of  # a callable: the app state exists only once the lifespan ran

    def collect(self) -> Iterable[GaugeMetricFamily]:
        state: AppState | None = self._state_of()
        if state is None:
            return
        now = time.time()
        # One committed state: read statement by statement, an attempt ending between the jobs' count
        # and the attempts' gave a scrape with a job running and no attempt running (one commit ends both).
        with state.db.read(snapshot=True) as session:
            by_status = dict(session.execute(text("SELECT status, count(*) FROM jobs GROUP BY status")).all())
            running = session.execute(
                text("SELECT count(*) FROM attempts WHERE status = 'running'")
            ).scalar_one()
            alive = count_alive(session.connection(), now, state.settings.lease_seconds)
        jobs = GaugeMetricFamily("flightdeck_jobs", "Jobs by status.", labels=["status"])
        for job_status in JobStatus:
            jobs.add_metric([job_status.value], float(by_status.get(job_status.value, 0)))
        yield jobs
        yield GaugeMetricFamily(
            "flightdeck_queue_depth", "Jobs waiting for a worker.", value=float(by_status.get("queued", 0))
        )
        yield GaugeMetricFamily(
            "flightdeck_running_attempts", "Attempts running on workers.", value=float(running)
        )
        yield GaugeMetricFamily(
            "flightdeck_workers_alive", "Workers heard from within one lease.", value=float(alive)
        )


class ServiceMetrics:
    """The registry of one app and the traffic metrics the middleware records."""

    def __init__(self, state_of: Any):
        self.registry = CollectorRegistry()
        self.registry.register(StoredStateCollector(state_of))
        self.request_seconds = Histogram(
            "flightdeck_request_duration_seconds",
            "HTTP request latency by route template.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.claim_seconds = Histogram(
            "flightdeck_claim_duration_seconds",
            "Time a claim took, long-poll wait included, by outcome.",
            ["outcome"],
            buckets=_CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.points_ingested = Counter(
            "flightdeck_metric_points_ingested",
            "Metric values stored (duplicates not counted).",
            registry=self.registry,
        )


class RequestMetrics:
    """ASGI middleware: request latency per route template, claim latency, metric points ingested.

    Claims and ingestion are read off the documented answers of their routes, so those routes stay
    free of instrumentation code.
    """

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status_code = 500
        body = bytearray()

        async def recording_send(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
            elif message["type"] == "http.response.body" and _route(scope) == METRICS_INGEST_ROUTE:
                body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self._record(scope, status_code, time.perf_counter() - started, bytes(body))

    def _record(self, scope: Scope, status_code: int, seconds: float, body: bytes) -> None:
        route = _route(scope)
        # Unmatched paths share one label so scanners cannot blow up the series count.
        label = route or "unmatched"
        self.metrics.request_seconds.labels(scope["method"], label, str(status_code)).observe(seconds)
        if route == CLAIM_ROUTE and scope["method"] == "POST":
            outcome = {200: "claimed", 204: "empty"}.get(status_code, "error")
            self.metrics.claim_seconds.labels(outcome).observe(seconds)
        elif route == METRICS_INGEST_ROUTE and status_code == 200 and body:
            try:
                accepted = orjson.loads(body).get("accepted", 0)
            except (orjson.JSONDecodeError, AttributeError):
                return
            if isinstance(accepted, int) and accepted > 0:
                self.metrics.points_ingested.inc(accepted)


def _route(scope: Scope) -> str | None:
    route = scope.get("route")  # FastAPI puts the matched APIRoute in the scope
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    # A mount (the dashboard's static files) sets no route but extends root_path by its prefix.
    mounted = scope.get("root_path", "")
    return mounted if isinstance(mounted, str) and mounted else None


router = APIRouter(tags=["meta"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def prometheus(request: Request) -> Response:
    """Prometheus text format (no token: ops scrape it; it holds counts, no job data)."""
    metrics: ServiceMetrics = request.app.state.service_metrics
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def install_metrics(app: Any) -> None:
    """Add GET /metrics and the request-timing middleware to `app`."""
    metrics = ServiceMetrics(lambda: getattr(app.state, "flightdeck", None))
    app.state.service_metrics = metrics
    app.include_router(router)
    app.add_middleware(RequestMetrics, metrics=metrics)
