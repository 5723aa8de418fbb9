"""The FastAPI application: settings, database, tokens, routes, and the lease reaper."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, InterfaceError, OperationalError

from flightdeck.contracts import SERVICE_DATA_MARKER
from flightdeck.service.api.body_limit import BodySizeLimit
from flightdeck.service.api.claim_batcher import ClaimBatcher
from flightdeck.service.api.claim_plain import PlainClaims
from flightdeck.service.api.deps import AUTHENTICATED_REFUSALS, OPEN_REFUSALS, AppState
from flightdeck.service.api.prometheus import install_metrics
from flightdeck.service.api.queue_wakeup import QueueWakeup
from flightdeck.service.api.routes import attempts, dashboard, jobs, meta, preflight, streams, workers
from flightdeck.service.core.auth import load_or_create_tokens
from flightdeck.service.core.config import Settings
from flightdeck.service.core.db import Database, migrate
from flightdeck.service.health_watch import detect_stalls
from flightdeck.service.leases import reap_expired_leases, renew_all_leases
from flightdeck.service.worker_identity import WorkerIdentities
from flightdeck.statuses import IllegalTransition

log = logging.getLogger("flightdeck.service")
# What a 503 asks clients to wait while the database is unavailable (a PostgreSQL restart takes seconds).
RETRY_AFTER_SECONDS = 2


async def _reap_forever(state: AppState) -> None:
    """Expired leases and stalled runs are looked for by the service itself, whether or not anyone asks.

    Each pass also checkpoints the WAL on SQLite, so reads do not walk a long log between automatic
    checkpoints, and on PostgreSQL refreshes the jobs table's statistics after a burst of changes.
    """
    while True:
        await asyncio.sleep(state.settings.reaper_interval_seconds)
        try:
            requeued = await run_in_threadpool(reap_expired_leases, state.db)
            if requeued:
                state.queue.notify()
            await run_in_threadpool(
                partial(detect_stalls, min_warn_seconds=state.settings.stall_warn_min_seconds),
                state.db,
                state.settings.stall_min_seconds,
                state.started_at,
            )
            await run_in_threadpool(state.db.checkpoint)
            await run_in_threadpool(state.db.refresh_statistics)
        except Exception:  # a failed pass must not end the reaper; the next pass retries
            log.exception("lease reaper pass failed")


def create_app(settings: Settings | None = None, on_started: Callable[[], None] | None = None) -> FastAPI:
    """The app; `on_started` runs once start-up (migrations included) is done, before the first request."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        # Workers refuse recipe paths and scripts under a directory holding this marker (S001).
        (settings.data_dir / SERVICE_DATA_MARKER).touch()
        await run_in_threadpool(migrate, settings.database_url)
        db = Database(settings.database_url)
        tokens = load_or_create_tokens(settings.data_dir, settings.user_tokens, settings.worker_tokens)
        state = AppState(
            settings=settings,
            db=db,
            tokens=tokens,
            queue=QueueWakeup(),
            claims=(PlainClaims if settings.claim_path == "plain" else ClaimBatcher)(
                db, settings.lease_seconds, settings.gang_wait_seconds
            ),
            identities=WorkerIdentities(db),
        )
        state.queue.bind(asyncio.get_running_loop())
        # Agents could not heartbeat while the service was down: give their attempts a full lease.
        await run_in_threadpool(renew_all_leases, db, settings.lease_seconds)
        app.state.flightdeck = state
        reaper = asyncio.create_task(_reap_forever(state))
        if on_started is not None:
            on_started()
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            db.close()

    app = FastAPI(
        title="Flightdeck",
        version="0.1.0",
        description="Fine-tuning jobs checked against known failures before and during launch.",
        lifespan=lifespan,
        telemetry=None if settings.otel else {"tracing": False, "metrics": False, "logs": False},
    )
    for router in (jobs.router, preflight.router, workers.router, attempts.router, streams.router):
        app.include_router(router, responses=AUTHENTICATED_REFUSALS)
    for router in (meta.router, dashboard.router):
        app.include_router(router, responses=OPEN_REFUSALS)
    app.mount(dashboard.STATIC_PREFIX, dashboard.static_files(), name="dashboard-static")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        # ensure_ascii: the echoed input may hold lone surrogates, which UTF-8 cannot encode.
        body = json.dumps({"detail": jsonable_encoder(exc.errors())}, ensure_ascii=True)
        return Response(body, status_code=422, media_type="application/json")

    @app.exception_handler(OverflowError)
    async def _overflow(_: Request, exc: OverflowError) -> JSONResponse:
        # SQLite integers are 64-bit; a larger id or number in a request is bad input, not a crash.
        detail = [
            {
                "loc": ["request"],
                "msg": f"a number is out of range (at most 2**63 - 1): {exc}",
                "type": "value_error",
            }
        ]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(IllegalTransition)
    async def _illegal(_: Request, exc: IllegalTransition) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(DataError)
    async def _out_of_range(_: Request, exc: DataError) -> JSONResponse:
        # PostgreSQL's INTEGER ids are 32-bit: an id beyond them in a path or body is bad input too.
        detail = [{"loc": ["request"], "msg": f"a value is out of range: {exc.orig}", "type": "value_error"}]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
        # The database is down, restarting or (SQLite) locked past its timeout: nothing was changed, and
        # the same request can succeed shortly. Agents and the CLI retry a 503.
        log.warning("database unavailable: %s", str(exc).splitlines()[0][:300])
        detail = "the database is unavailable right now; nothing was changed, retry in a few seconds"
        return JSONResponse(
            status_code=503, content={"detail": detail}, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )

    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    install_metrics(app)  # outermost middleware: it times everything, 413s included
    publish_stream_refusals_as_json(app)
    return app


def publish_stream_refusals_as_json(app: FastAPI) -> None:
    """FastAPI documents every response of an event-stream route as text/event-stream; its refusals
    (401, 404, 422, ...) are JSON like everywhere else, and the document must say so."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            for operation in (op for path in document["paths"].values() for op in path.values()):
                for code, answer in operation.get("responses", {}).items():
                    content = answer.get("content", {})
                    if code != "200" and "text/event-stream" in content:
                        content["application/json"] = content.pop("text/event-stream")
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
