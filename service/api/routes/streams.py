"""Live streams over server-sent events (FastAPI's own `fastapi.sse`): a job's log and its metrics.

Each stream follows the job's current attempt (a requeue announces itself with an `attempt` event
and restarts the cursors), sends `status` whenever the job's status changes, and ends with `end`
once the job is terminal and everything stored has been sent. A stream also closes, without `end`,
after `stream_seconds` (a setting), which bounds how long a restart waits on open streams: clients reconnect with their
cursors (and `attempt_id`, the attempt those cursors belong to). Browsers cannot put a bearer token
on an EventSource, so the dashboard reads these with fetch() and the same Authorization header.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, status
from fastapi.concurrency import run_in_threadpool
from fastapi.sse import EventSourceResponse, ServerSentEvent
from sqlmodel import col, select

from flightdeck.contracts import MAX_ATTEMPT_NUMBER, STEP_LIMIT
from flightdeck.service.api.deps import StateDep, UserState
from flightdeck.service.api.queue_wakeup import QueueWakeup
from flightdeck.service.core.db import Database
from flightdeck.service.job_reads import job_summary
from flightdeck.service.models import Attempt, Event, EventPublic, Job
from flightdeck.service.reports.log_chunks import read_log
from flightdeck.service.reports.metric_reads import read_steps
from flightdeck.statuses import JobStatus

router = APIRouter(tags=["streams"])

POLL_SECONDS = 0.5
LOG_CHUNK_BYTES = 256 * 1024
METRIC_PAGE = 1000


def _existing_job(state: StateDep, job_id: int) -> int:
    """Checked before the stream starts, so an unknown job is a plain 404, not an empty stream."""
    with state.db.read() as session:
        if session.get(Job, job_id) is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    return job_id


JobIdDep = Annotated[int, Depends(_existing_job)]


def _job_state(db: Database, job_id: int) -> tuple[dict[str, Any], int | None]:
    """The job as its `status` events show it (its summary, as GET /jobs lists it), and its current
    attempt, which the stream follows."""
    with db.read() as session:
        job = session.get(Job, job_id)
    assert job is not None  # jobs are never deleted
    return job_summary(job).model_dump(), job.current_attempt_id


def _attempt_id(db: Database, job_id: int, number: int) -> int | None:
    with db.read() as session:
        found = session.exec(
            select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number)
        ).first()
    return found.id if found else None


def _events_after(db: Database, job_id: int, after: int) -> list[dict[str, Any]]:
    with db.read() as session:
        rows = session.exec(
            select(Event)
            .where(Event.job_id == job_id, col(Event.id) > after)
            .order_by(col(Event.id))
            .limit(1000)
        ).all()
    return [EventPublic.model_validate(e.model_dump()).model_dump(mode="json") for e in rows]


class _Follower:
    """Which attempt a stream reads (a fixed one, or the job's current one) and where its cursor starts."""

    def __init__(
        self,
        db: Database,
        job_id: int,
        attempt: int | None,
        cursor_attempt: int | None,
        queue: QueueWakeup,
        seconds: float,
    ):
        self.db, self.job_id, self.number = db, job_id, attempt
        self.queue = queue
        self.attempt_id: int | None = None
        self.cursor_attempt = cursor_attempt
        self.first = True
        self.deadline = time.monotonic() + seconds

    async def changed(self, current_attempt_id: int | None) -> bool:
        if self.number is not None:
            if self.attempt_id is not None:
                return False
            self.attempt_id = await run_in_threadpool(_attempt_id, self.db, self.job_id, self.number)
        elif current_attempt_id != self.attempt_id:
            self.attempt_id = current_attempt_id
        else:
            return False
        return self.attempt_id is not None

    def keeps_cursor(self) -> bool:
        """The client's cursor holds for the first attempt, if it belongs to that attempt."""
        first, self.first = self.first, False
        return first and self.cursor_attempt in (None, self.attempt_id)

    def expired(self) -> bool:
        # A stopping server ends its streams within a poll; clients reconnect to the next one.
        return self.queue.stopping or time.monotonic() > self.deadline


CursorAttempt = Annotated[
    int | None,
    Query(
        ge=1, lt=STEP_LIMIT, description="the attempt id the cursor belongs to; another attempt starts from 0"
    ),
]


@router.get("/jobs/{job_id}/logs/stream", response_class=EventSourceResponse)
async def log_stream(
    state: UserState,
    job_id: JobIdDep,
    offset: Annotated[
        int, Query(ge=0, lt=STEP_LIMIT, description="byte offset to start from in the attempt's output.log")
    ] = 0,
    attempt: Annotated[
        int | None,
        Query(ge=1, le=MAX_ATTEMPT_NUMBER, description="attempt number; default: follow the current one"),
    ] = None,
    attempt_id: CursorAttempt = None,
    node: Annotated[
        int, Query(ge=0, le=1023, description="node rank of a multi-node attempt (each ships its own log)")
    ] = 0,
) -> AsyncIterable[ServerSentEvent]:
    """Events: `attempt`, `log` ({attempt_id, offset, next_offset, text}), `status`, `end`."""
    follower = _Follower(state.db, job_id, attempt, attempt_id, state.queue, state.settings.stream_seconds)
    position, last_status = offset, None
    while not follower.expired():
        job, current_attempt_id = await run_in_threadpool(_job_state, state.db, job_id)
        if await follower.changed(current_attempt_id):
            position = offset if follower.keeps_cursor() else 0
            yield ServerSentEvent(event="attempt", data={"attempt_id": follower.attempt_id})
        sent = False
        if follower.attempt_id is not None:
            chunk = await run_in_threadpool(
                read_log, state.db, follower.attempt_id, position, LOG_CHUNK_BYTES, node
            )
            if chunk["next_offset"] > position:
                position = chunk["next_offset"]
                sent = True
                yield ServerSentEvent(
                    event="log",
                    data={"attempt_id": follower.attempt_id, **chunk},
                    id=f"{follower.attempt_id}:{position}",
                )
        if job["status"] != last_status:
            last_status = job["status"]
            yield ServerSentEvent(event="status", data=job)
        if sent:
            continue  # more may be waiting: read again before sleeping
        if JobStatus(job["status"]).is_terminal():
            yield ServerSentEvent(event="end", data={"status": job["status"], "next_offset": position})
            return
        await asyncio.sleep(POLL_SECONDS)


@router.get("/jobs/{job_id}/metrics/stream", response_class=EventSourceResponse)
async def metrics_stream(
    state: UserState,
    job_id: JobIdDep,
    after: Annotated[int, Query(ge=-1, lt=STEP_LIMIT, description="send steps after this one")] = -1,
    events_after: Annotated[int, Query(ge=0, lt=STEP_LIMIT, description="send events with a larger id")] = 0,
    keys: Annotated[str | None, Query(max_length=2000, description="comma-separated metric names")] = None,
    attempt: Annotated[
        int | None,
        Query(ge=1, le=MAX_ATTEMPT_NUMBER, description="attempt number; default: follow the current one"),
    ] = None,
    attempt_id: CursorAttempt = None,
) -> AsyncIterable[ServerSentEvent]:
    """Events: `attempt`, `metrics` ({attempt_id, points}), `events` ({events}), `status`, `end`."""
    wanted = [k for k in keys.split(",") if k] if keys else None
    follower = _Follower(state.db, job_id, attempt, attempt_id, state.queue, state.settings.stream_seconds)
    cursor, last_status = after, None
    while not follower.expired():
        job, current_attempt_id = await run_in_threadpool(_job_state, state.db, job_id)
        if await follower.changed(current_attempt_id):
            cursor = after if follower.keeps_cursor() else -1
            yield ServerSentEvent(event="attempt", data={"attempt_id": follower.attempt_id})
        full_page = False
        if follower.attempt_id is not None:
            points, _next = await run_in_threadpool(
                read_steps,
                state.db,
                follower.attempt_id,
                cursor,
                METRIC_PAGE,
                wanted,
                state.settings.max_metric_keys,
            )
            if points:
                cursor = points[-1]["step"]
                full_page = len(points) == METRIC_PAGE
                yield ServerSentEvent(
                    event="metrics", data={"attempt_id": follower.attempt_id, "points": points}
                )
        found = await run_in_threadpool(_events_after, state.db, job_id, events_after)
        if found:
            events_after = found[-1]["id"]
            yield ServerSentEvent(event="events", data={"events": found})
        if job["status"] != last_status:
            last_status = job["status"]
            yield ServerSentEvent(event="status", data=job)
        if full_page:
            continue
        if JobStatus(job["status"]).is_terminal():
            yield ServerSentEvent(event="end", data={"status": job["status"], "after": cursor})
            return
        await asyncio.sleep(POLL_SECONDS)
