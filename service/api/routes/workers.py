"""Workers: register, heartbeat (leases and cancel orders), claim with long-poll; list for users."""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlmodel import col, select

from flightdeck.contracts import (
    Claimed,
    ClaimedAttempt,
    ClaimRequest,
    Heartbeat,
    HeartbeatAnswer,
    NameTaken,
    Registered,
    Registration,
)
from flightdeck.service.api.claim_long_poll import serve_claim
from flightdeck.service.api.deps import Enrolment, UserState, WorkerCall, json_object_schema
from flightdeck.service.claims import ClaimOrder
from flightdeck.service.leases import heartbeat
from flightdeck.service.models import Attempt, AttemptNode, Worker, WorkerPublic
from flightdeck.service.registration import (
    NotThisWorker,
    adopt_held_attempts,
    register_worker,
    revoke_worker,
)
from flightdeck.service.worker_liveness import is_alive
from flightdeck.statuses import NODE_ACTIVE, AttemptStatus

router = APIRouter(tags=["workers"])

MAX_WORKER_ID = 2**63 - 1  # SQLite integers are 64-bit
MAX_WAIT_SECONDS = 300.0
_ACTIVE = sorted(s.value for s in NODE_ACTIVE)


@router.post("/workers", status_code=status.HTTP_201_CREATED, response_model=Registered)
def register(caller: Enrolment, body: Registration, request: Request) -> Registered:
    state, settings = caller.state, caller.state.settings
    keep_token = body.keep_token and caller.worker_id is not None
    try:
        worker, token = register_worker(
            state.db,
            body.name,
            body.inventory,
            caller=caller.worker_id,
            lease_seconds=settings.lease_seconds,
            keep_token=keep_token,
        )
    except NameTaken as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    except NotThisWorker as exc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, str(exc)) from exc
    assert worker.id is not None
    # Held attempts are adopted only by the worker itself (its own token): one that had to enrol again
    # was revoked or is unknown to this database, and its attempts ended with it.
    stop = (
        adopt_held_attempts(state.db, worker.id, body.held, settings.lease_seconds)
        if caller.worker_id is not None
        else sorted(set(body.held))
    )
    return Registered(
        id=worker.id,
        name=worker.name,
        lease_seconds=settings.lease_seconds,
        heartbeat_interval=settings.heartbeat_interval_seconds,
        token=token or request.headers["Authorization"].split(" ", 1)[1].strip(),
        database=state.db.database_id,
        stop=stop,
    )


@router.post("/workers/{worker_id}/revoke", response_model=WorkerPublic)
def revoke(state: UserState, worker_id: Annotated[int, Path(ge=0, le=MAX_WORKER_ID)]) -> WorkerPublic:
    """The worker's token stops working at once; its running attempts are lost as for an expired lease
    (requeued while attempts remain). It may register again with the enrolment token."""
    worker = revoke_worker(state.db, worker_id)
    if worker is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no worker {worker_id}")
    state.queue.notify()
    return WorkerPublic(
        id=worker_id,
        name=worker.name,
        inventory=worker.inventory,
        registered_at=worker.registered_at,
        last_seen_at=worker.last_seen_at,
        alive=False,
        running_attempts=[],
    )


@router.post("/workers/{worker_id}/heartbeat", response_model=HeartbeatAnswer)
def beat(caller: WorkerCall, worker_id: int, body: Heartbeat) -> HeartbeatAnswer:
    caller.owns(worker_id)
    state = caller.state
    cancel = heartbeat(state.db, worker_id, body.attempts, state.settings.lease_seconds)
    if cancel is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no worker {worker_id}; register again")
    return HeartbeatAnswer(cancel=cancel, lease_seconds=state.settings.lease_seconds)


@router.post(
    "/workers/{worker_id}/claim",
    response_model=Claimed,
    responses={204: {"description": "no job fitted this worker within `wait` seconds"}},
    openapi_extra=json_object_schema(
        "The devices free on the worker now (omitted or null: all of them).",
        ClaimRequest.model_json_schema(),
        required=False,
    ),
)
async def claim(
    caller: WorkerCall,
    worker_id: Annotated[int, Path(ge=0, le=MAX_WORKER_ID)],
    request: Request,
    wait: Annotated[
        float, Query(ge=0, le=MAX_WAIT_SECONDS, description="long-poll: seconds to wait for a job")
    ] = 0,
) -> Any:
    caller.owns(worker_id)
    state = caller.state
    raw = await request.body()
    try:
        asked = claim_request(raw)
    except ValidationError as exc:
        raise RequestValidationError(
            # Without the input: a body that is not UTF-8 cannot be echoed back in JSON.
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False, include_input=False)]
        ) from exc
    try:
        order = ClaimOrder(worker_id, asked.devices, caller.token_hash, asked.nodes)
        claimed = await serve_claim(state, order, wait, request.is_disconnected)
    except LookupError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{exc}; register again") from exc
    except ValueError as exc:  # devices the worker never registered
        raise RequestValidationError(
            [{"loc": ("body", "devices"), "msg": str(exc), "type": "value_error"}]
        ) from exc
    if claimed is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return Response(claim_answer(claimed), media_type="application/json")


def claim_answer(claimed: ClaimedAttempt) -> bytes:
    """The 200 body (`Claimed`).

    Serialised by hand: the recipe and plan were checked when built, and FastAPI's response
    validation of them cost more than the claim's SQL. The schema stays documented on the route.
    """
    return orjson.dumps({"attempt": claimed.wire()})


def claim_request(raw: bytes) -> ClaimRequest:
    """What a claim's body asks with (devices None: all of the worker's); ValidationError if it is bad.

    The body is read by hand, as on the metrics route: FastAPI's body handling cost a fifth of a
    claim's CPU under load. Errors keep the shape (and 422) of FastAPI's own.
    """
    if raw.strip() in (b"", b"null"):
        return ClaimRequest()
    return ClaimRequest.model_validate_json(raw)


@router.get("/workers", response_model=list[WorkerPublic])
def workers(state: UserState) -> list[WorkerPublic]:
    now = time.time()
    with state.db.read() as session:
        rows = session.exec(select(Worker).order_by(Worker.name)).all()
        # Each worker runs the attempts it holds a node of (a gang's members each hold one).
        running = session.exec(
            select(AttemptNode.worker_id, AttemptNode.attempt_id)
            .join(Attempt, col(Attempt.id) == AttemptNode.attempt_id)
            .where(Attempt.status == AttemptStatus.running, col(AttemptNode.status).in_(_ACTIVE))
            .distinct()
            .order_by(col(AttemptNode.attempt_id))
        ).all()
    by_worker: dict[int, list[int]] = {}
    for worker_id, attempt_id in running:
        if attempt_id is not None:
            by_worker.setdefault(worker_id, []).append(attempt_id)
    lease = state.settings.lease_seconds
    return [
        WorkerPublic(
            id=w.id or 0,
            name=w.name,
            inventory=w.inventory,
            registered_at=w.registered_at,
            last_seen_at=w.last_seen_at,
            alive=is_alive(w, now, lease),
            running_attempts=by_worker.get(w.id or 0, []),
        )
        for w in rows
    ]
