"""Jobs for users: submit, list, read, cancel, and the job's metrics, logs and events."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sqlmodel import col, select

from flightdeck.contracts import MAX_ATTEMPT_NUMBER, STEP_LIMIT
from flightdeck.recipe import Finding, RecipeInvalid
from flightdeck.service.api.deps import AppState, RecipeBody, UserState, json_object_schema
from flightdeck.service.core.tables import attempts as attempts_table
from flightdeck.service.core.tables import jobs as jobs_table
from flightdeck.service.job_reads import job_detail, list_jobs, public_job
from flightdeck.service.jobs import cancel_job, submit_job
from flightdeck.service.models import Event, EventPublic, Job, JobDetail, JobPublic, JobsPublic
from flightdeck.service.reports.log_chunks import read_log
from flightdeck.service.reports.metric_reads import read_downsampled, read_series, read_steps
from flightdeck.statuses import JobStatus

router = APIRouter(tags=["jobs"])
# SQLite integers are signed 64-bit: a larger cursor is refused up front.


class Refused(BaseModel):
    """Every problem with a recipe at once (or FastAPI's list when a query parameter is wrong)."""

    detail: str | list[dict[str, Any]]
    findings: list[Finding] = []


REFUSED: dict[int | str, dict[str, Any]] = {
    422: {"model": Refused, "description": "every problem with the recipe, each with path, message and code"}
}


def refused(findings: list[Any]) -> JSONResponse:
    body = [f.model_dump(mode="json") for f in findings]
    return JSONResponse(
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
        content={
            "detail": f"the recipe was refused: {len(body)} problem(s); fix each and resubmit",
            "findings": body,
        },
    )


@router.post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    response_model=JobPublic,
    responses=REFUSED,
    openapi_extra=json_object_schema("A recipe (GET /recipes/schema)."),
)
def submit(
    state: UserState,
    payload: RecipeBody,
    priority: Annotated[int, Query(ge=-1000, le=1000)] = 0,
    max_attempts: Annotated[int | None, Query(ge=1, le=100)] = None,
) -> Any:
    try:
        job = submit_job(
            state.db,
            payload,
            priority=priority,
            max_attempts=max_attempts or state.settings.default_max_attempts,
        )
    except RecipeInvalid as exc:
        return refused(exc.findings)
    state.queue.notify()
    return public_job(job)


@router.get("/jobs", response_model=JobsPublic)
def jobs(
    state: UserState,
    status_filter: Annotated[JobStatus | None, Query(alias="status")] = None,
    cursor: Annotated[
        int | None, Query(ge=0, lt=STEP_LIMIT, description="next_cursor of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JobsPublic:
    return list_jobs(
        state.db, status=status_filter.value if status_filter else None, before=cursor, limit=limit
    )


def _job_or_404(state: AppState, job_id: int) -> Job:
    with state.db.read() as session:
        job = session.get(Job, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    return job


@router.get("/jobs/{job_id}", response_model=JobDetail)
def job(state: UserState, job_id: int) -> JobDetail:
    detail = job_detail(state.db, job_id, lease_seconds=state.settings.lease_seconds)
    if detail is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    return detail


@router.post("/jobs/{job_id}/cancel", response_model=JobPublic, status_code=status.HTTP_202_ACCEPTED)
def cancel(state: UserState, job_id: int) -> JobPublic:
    found = cancel_job(state.db, job_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    return public_job(found)


def _attempt_id(state: AppState, job_id: int, attempt: int | None) -> int | None:
    """The attempt a metric read is about (None: the job has not started); 404 for no such job or attempt.

    One indexed query: loading the job through the ORM decoded its recipe columns on every read.
    """
    j, a = jobs_table.c, attempts_table.c
    with state.db.reading() as conn:
        row = conn.execute(
            select(j.current_attempt_id, a.id)
            .select_from(jobs_table.outerjoin(attempts_table, (a.job_id == j.id) & (a.number == attempt)))
            .where(j.id == job_id)
        ).first()
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    if attempt is None:
        return row[0]  # type: ignore[no-any-return]
    if row[1] is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has no attempt {attempt}")
    return row[1]  # type: ignore[no-any-return]


AttemptQuery = Annotated[
    int | None, Query(ge=1, le=MAX_ATTEMPT_NUMBER, description="attempt number; default: the latest")
]
KeysQuery = Annotated[str | None, Query(max_length=2000, description="comma-separated metric names")]


def fast_json(body: dict[str, Any]) -> Response:
    """Metric reads carry up to a million numbers: orjson directly, not FastAPI's generic encoder (~50x)."""
    return Response(orjson.dumps(body), media_type="application/json")


def _keys(keys: str | None) -> list[str] | None:
    return [k for k in keys.split(",") if k] if keys else None


@router.get("/jobs/{job_id}/metrics")
def metrics(
    state: UserState,
    job_id: int,
    after: Annotated[
        int, Query(ge=-1, lt=STEP_LIMIT, description="return steps after this one (cursor)")
    ] = -1,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    attempt: AttemptQuery = None,
    keys: KeysQuery = None,
) -> Any:
    attempt_id = _attempt_id(state, job_id, attempt)
    if attempt_id is None:
        return {"job_id": job_id, "attempt_id": None, "points": [], "next_after": None}
    points, next_after = read_steps(
        state.db, attempt_id, after, limit, _keys(keys), state.settings.max_metric_keys
    )
    return fast_json({"job_id": job_id, "attempt_id": attempt_id, "points": points, "next_after": next_after})


@router.get("/jobs/{job_id}/metrics/series/{key}")
def series(
    state: UserState,
    job_id: int,
    key: str,
    after: Annotated[int, Query(ge=-1, lt=STEP_LIMIT)] = -1,
    limit: Annotated[int, Query(ge=1, le=1_000_000)] = 100_000,
    attempt: AttemptQuery = None,
) -> Any:
    attempt_id = _attempt_id(state, job_id, attempt)
    if attempt_id is None:
        return {"key": key, "steps": [], "values": [], "next_after": None}
    return fast_json(read_series(state.db, attempt_id, key, after, limit))


@router.get("/jobs/{job_id}/metrics/downsampled")
def downsampled(
    state: UserState,
    job_id: int,
    buckets: Annotated[int, Query(ge=10, le=10_000)] = 1000,
    attempt: AttemptQuery = None,
    keys: KeysQuery = None,
) -> Any:
    attempt_id = _attempt_id(state, job_id, attempt)
    if attempt_id is None:
        return {"attempt_id": None, "buckets": buckets, "series": {}}
    return fast_json(
        read_downsampled(state.db, attempt_id, _keys(keys), buckets, state.settings.max_metric_keys)
    )


@router.get("/jobs/{job_id}/logs")
def logs(
    state: UserState,
    job_id: int,
    offset: Annotated[
        int, Query(ge=0, lt=STEP_LIMIT, description="byte offset in the attempt's output.log")
    ] = 0,
    max_bytes: Annotated[int, Query(ge=1, le=8 * 1024 * 1024)] = 1024 * 1024,
    attempt: AttemptQuery = None,
    node: Annotated[
        int, Query(ge=0, le=1023, description="node rank of a multi-node attempt (each ships its own log)")
    ] = 0,
) -> dict[str, Any]:
    attempt_id = _attempt_id(state, job_id, attempt)
    if attempt_id is None:
        return {"attempt_id": None, "node": node, "offset": offset, "next_offset": offset, "text": ""}
    return {"attempt_id": attempt_id, "node": node, **read_log(state.db, attempt_id, offset, max_bytes, node)}


@router.get("/jobs/{job_id}/events")
def events(
    state: UserState,
    job_id: int,
    after: Annotated[
        int, Query(ge=0, lt=STEP_LIMIT, description="return events with a larger id (cursor)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    _job_or_404(state, job_id)
    with state.db.read() as session:
        rows = session.exec(
            select(Event)
            .where(Event.job_id == job_id, col(Event.id) > after)
            .order_by(col(Event.id))
            .limit(limit)
        ).all()
    data = [EventPublic.model_validate(e.model_dump()) for e in rows]
    return {"job_id": job_id, "events": data, "next_after": data[-1].id if data else after}
