"""Workers: register, heartbeat (leases and cancel orders), claim with long-poll; list for users."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Response, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from sqlmodel import select

from service.api.deps import StateDep, UserDep, WorkerDep
from service.inventory import WorkerInventory
from service.models import Attempt, Worker, WorkerPublic
from service.scheduler import ClaimedAttempt, claim_next_job, heartbeat, register_worker
from service.statuses import AttemptStatus

router = APIRouter(tags=["workers"])


class Registration(BaseModel):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@-]+$")
    inventory: WorkerInventory


class Registered(BaseModel):
    id: int
    name: str
    lease_seconds: float
    heartbeat_interval: float


class Heartbeat(BaseModel):
    attempts: list[int] = Field(default_factory=list, max_length=1024)


class HeartbeatAnswer(BaseModel):
    cancel: list[int]
    lease_seconds: float


class ClaimRequest(BaseModel):
    devices: list[Annotated[int, Field(ge=0, le=1023)]] | None = Field(None, max_length=1024)


class Claimed(BaseModel):
    attempt: ClaimedAttempt


@router.post("/workers", status_code=status.HTTP_201_CREATED, response_model=Registered)
def register(state: StateDep, _: WorkerDep, body: Registration) -> Registered:
    worker = register_worker(state.db, body.name, body.inventory)
    assert worker.id is not None
    settings = state.settings
    return Registered(
        id=worker.id,
        name=worker.name,
        lease_seconds=settings.lease_seconds,
        heartbeat_interval=settings.heartbeat_interval_seconds,
    )


@router.post("/workers/{worker_id}/heartbeat", response_model=HeartbeatAnswer)
def beat(state: StateDep, _: WorkerDep, worker_id: int, body: Heartbeat) -> HeartbeatAnswer:
    cancel = heartbeat(state.db, worker_id, body.attempts, state.settings.lease_seconds)
    if cancel is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no worker {worker_id}; register again")
    return HeartbeatAnswer(cancel=cancel, lease_seconds=state.settings.lease_seconds)


@router.post(
    "/workers/{worker_id}/claim",
    response_model=Claimed,
    responses={204: {"description": "no job fitted this worker within `wait` seconds"}},
)
async def claim(
    state: StateDep,
    _: WorkerDep,
    worker_id: int,
    body: ClaimRequest | None = None,
    wait: Annotated[float, Query(ge=0, le=300, description="long-poll: seconds to wait for a job")] = 0,
) -> Any:
    deadline = time.monotonic() + min(wait, state.settings.claim_max_wait_seconds)
    devices = body.devices if body else None
    while True:
        wake = state.queue.current()
        try:
            claimed = await run_in_threadpool(
                claim_next_job, state.db, worker_id, devices, state.settings.lease_seconds
            )
        except LookupError as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{exc}; register again") from exc
        if claimed is not None:
            return Claimed(attempt=claimed)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Response(status_code=status.HTTP_204_NO_CONTENT)
        try:
            await asyncio.wait_for(wake.wait(), timeout=remaining)
        except TimeoutError:
            return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/workers", response_model=list[WorkerPublic])
def workers(state: StateDep, _: UserDep) -> list[WorkerPublic]:
    now = time.time()
    with state.db.read() as session:
        rows = session.exec(select(Worker).order_by(Worker.name)).all()
        running = session.exec(select(Attempt).where(Attempt.status == AttemptStatus.running)).all()
    by_worker: dict[int, list[int]] = {}
    for attempt in running:
        if attempt.worker_id is not None and attempt.id is not None:
            by_worker.setdefault(attempt.worker_id, []).append(attempt.id)
    lease = state.settings.lease_seconds
    return [
        WorkerPublic(
            id=w.id or 0,
            name=w.name,
            inventory=w.inventory,
            registered_at=w.registered_at,
            last_seen_at=w.last_seen_at,
            alive=now - w.last_seen_at < lease,
            running_attempts=by_worker.get(w.id or 0, []),
        )
        for w in rows
    ]
