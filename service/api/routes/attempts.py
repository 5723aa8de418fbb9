"""What agents report about an attempt: metrics, events, log chunks, and how it ended."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from flightdeck.contracts import (
    AttemptNotRunning,
    EventBatch,
    FinishReport,
    LogChunk,
    MetricBatch,
    NodeReady,
    NodeStart,
)
from flightdeck.service.api.deps import (
    AppState,
    Problem,
    WorkerCall,
    WorkerCaller,
    json_object_schema,
    no_attempt,
)
from flightdeck.service.attempt_endings import NotReleasable, finish_attempt, release_attempt
from flightdeck.service.gangs.barrier import SingleNode, mark_ready, ready_state
from flightdeck.service.gangs.nodes import holds_node
from flightdeck.service.models import Attempt
from flightdeck.service.reports.attempt_events import store_events
from flightdeck.service.reports.bad_report import BadReport
from flightdeck.service.reports.log_chunks import store_log_chunk
from flightdeck.service.reports.metric_ingest import NotTheOwner, ingest_metrics

router = APIRouter(tags=["attempts"])
# The metrics route reads its body by hand (the hottest route); its published schema is the contract's.
_METRIC_BATCH_SCHEMA = MetricBatch.model_json_schema()  # its $defs travel inside the schema


def unprocessable(exc: BadReport) -> HTTPException:
    """A refused report, in the same shape as FastAPI's own validation errors."""
    detail = [{"loc": ["body"], "msg": str(exc), "type": "value_error"}]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)


def _job_of(caller: WorkerCaller, attempt_id: int) -> int:
    """The attempt's job; 404 when there is none or the caller does not hold it."""
    return _node_of(caller, attempt_id)[0]


def _node_of(caller: WorkerCaller, attempt_id: int, node: int | None = None) -> tuple[int, int]:
    """(the attempt's job, the caller's node rank: `node` when given); 404 when there is no such attempt
    or the caller holds no node of it, or not `node` (a single-node attempt's one node is its claimer's,
    rank 0)."""
    with caller.state.db.read() as session:
        attempt = session.get(Attempt, attempt_id)
        rank = None
        if attempt is not None and caller.worker_id is not None:
            rank = holds_node(session.connection(), attempt_id, caller.worker_id, node)
    if attempt is None or rank is None:
        raise no_attempt(attempt_id)
    return attempt.job_id, rank


@router.post(
    "/attempts/{attempt_id}/metrics",
    openapi_extra=json_object_schema("A batch of steps.", _METRIC_BATCH_SCHEMA),
)
async def metrics(caller: WorkerCall, attempt_id: int, request: Request) -> dict[str, int]:
    # The body is parsed by hand (orjson, no pydantic per point): this is the hottest route.
    body = await request.body()
    try:
        # One thread hop for the lookup and the insert: each hop costs a thread switch per request.
        state = caller.state
        stored = await run_in_threadpool(
            ingest_metrics, state.db, attempt_id, body, caller.worker_id, state.settings.max_metric_keys
        )
    except BadReport as exc:
        raise unprocessable(exc) from exc
    except NotTheOwner:
        stored = None  # answered as a missing attempt, as on every attempt route
    if stored is None:
        raise no_attempt(attempt_id)
    accepted, duplicates = stored
    return {"accepted": accepted, "duplicates": duplicates}


@router.post("/attempts/{attempt_id}/events")
def events(caller: WorkerCall, attempt_id: int, body: EventBatch) -> dict[str, int]:
    job_id = _job_of(caller, attempt_id)
    try:
        accepted, duplicates = store_events(
            caller.state.db, attempt_id, job_id, [e.model_dump() for e in body.events]
        )
    except BadReport as exc:
        raise unprocessable(exc) from exc
    return {"accepted": accepted, "duplicates": duplicates}


@router.post("/attempts/{attempt_id}/logs")
def logs(caller: WorkerCall, attempt_id: int, body: LogChunk) -> dict[str, int]:
    job_id, node_rank = _node_of(caller, attempt_id, body.node)
    try:
        store_log_chunk(caller.state.db, attempt_id, job_id, body.offset, body.text, body.length, node_rank)
    except BadReport as exc:
        raise unprocessable(exc) from exc
    return {"offset": body.offset}


class AttemptConflictDetail(BaseModel):
    message: str
    attempt_status: str


class AttemptConflict(BaseModel):
    detail: AttemptConflictDetail


@router.post(
    "/attempts/{attempt_id}/finish",
    responses={409: {"model": AttemptConflict, "description": "the attempt already ended otherwise"}},
)
def finish(caller: WorkerCall, attempt_id: int, body: FinishReport) -> dict[str, Any]:
    _job_of(caller, attempt_id)
    state = caller.state
    try:
        ended = finish_attempt(state.db, attempt_id, body, caller.worker_id)
    except AttemptNotRunning as exc:
        raise HTTPException(
            status.HTTP_409_CONFLICT, {"message": str(exc), "attempt_status": exc.status}
        ) from exc
    if ended is None:
        raise no_attempt(attempt_id)
    job, attempt = ended
    state.queue.notify()  # a requeued job can be claimed at once
    return {"job_id": job.id, "job_status": job.status, "attempt_status": attempt.status}


@router.post(
    "/attempts/{attempt_id}/release",
    responses={
        409: {"model": Problem, "description": "the attempt has begun or ended; it ends by its lease"}
    },
)
def release(caller: WorkerCall, attempt_id: int) -> dict[str, Any]:
    """Hand back an attempt the agent will not run (it was stopping when the claim answered): the job
    is queued again with its attempt count unchanged."""
    _job_of(caller, attempt_id)
    state = caller.state
    try:
        job = release_attempt(state.db, attempt_id)
    except NotReleasable as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    if job is None:
        raise no_attempt(attempt_id)
    state.queue.notify()  # claimable again at once
    return {"job_id": job.id, "job_status": job.status, "attempt_count": job.attempt_count}


@router.post(
    "/attempts/{attempt_id}/nodes/{node_rank}/ready",
    response_model=NodeStart,
    responses={409: {"model": Problem, "description": "the attempt runs on one node"}},
)
async def node_ready(
    caller: WorkerCall,
    attempt_id: int,
    node_rank: int,
    body: NodeReady,
    wait: Annotated[
        float, Query(ge=0, le=60, description="long-poll: seconds to wait for every node to be ready")
    ] = 0,
) -> NodeStart:
    """The start barrier of a multi-node attempt: no rank starts until every node's host passed preflight
    and node 0 reported its port; safe to repeat. With `wait`, answers as soon as every node is ready
    or the attempt stops (a node reporting ready wakes the others' waits), else after `wait` seconds."""
    _, rank = await run_in_threadpool(_node_of, caller, attempt_id)
    if rank != node_rank:
        caller.owns(None)  # 403: a worker speaks only for its own node
    if node_rank == 0 and body.port is None:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, "port: node 0 reports the rendezvous port it found free"
        )
    state = caller.state
    port = body.port if node_rank == 0 else None
    deadline = time.monotonic() + wait
    try:
        first = True
        while True:
            wake = state.queue.current()  # taken before looking, so a node ready meanwhile is not missed
            answer = await run_in_threadpool(_ready, state, attempt_id, caller.worker_id or 0, port, first)
            if first:
                state.queue.notify()  # nodes waiting on this one look again
                first = False
            remaining = deadline - time.monotonic()
            if answer.start or answer.abort or remaining <= 0 or state.queue.stopping:
                return answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=min(remaining, 1.0))  # 1 s: a lost node
    except SingleNode as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc


def _ready(state: AppState, attempt_id: int, worker_id: int, port: int | None, mark: bool) -> NodeStart:
    with state.db.writing() as conn:
        if mark:
            mark_ready(conn, attempt_id, worker_id, port, time.time())
        return ready_state(conn, attempt_id)
