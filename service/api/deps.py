"""Request dependencies: the application's state, authentication by scope, JSON bodies."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from flightdeck.service.api.claim_batcher import ClaimBatcher
from flightdeck.service.api.claim_plain import PlainClaims
from flightdeck.service.api.queue_wakeup import QueueWakeup
from flightdeck.service.core.auth import Scope, TokenRegistry
from flightdeck.service.core.config import Settings
from flightdeck.service.core.db import Database
from flightdeck.service.worker_identity import WorkerIdentities


@dataclass
class AppState:
    settings: Settings
    db: Database
    tokens: TokenRegistry
    queue: QueueWakeup
    claims: ClaimBatcher | PlainClaims  # settings.claim_path
    identities: WorkerIdentities
    started_at: float = field(default_factory=time.time)


async def get_state(request: Request) -> AppState:
    # async: FastAPI runs a plain def dependency in the thread pool, one thread hop per request.
    state: AppState = request.app.state.flightdeck
    return state


StateDep = Annotated[AppState, Depends(get_state)]
_bearer = HTTPBearer(auto_error=False, description="A user or worker token")


def _credentials(credentials: HTTPAuthorizationCredentials | None) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send 'Authorization: Bearer <token>' (see <data-dir>/tokens.env)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return credentials.credentials


def _require_user() -> Any:
    # One dependency per route that checks the token and hands over the state: each dependency FastAPI
    # solves costs per request, and on the claim route they were a third of its CPU (bench/README.md).
    async def check(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> AppState:
        state: AppState = request.app.state.flightdeck
        token = _credentials(credentials)
        found = state.tokens.scope_of(token)
        if found is Scope.user:
            return state
        if found is Scope.worker or await state.identities.worker_of(token) is not None:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs a user token, not a worker token")
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "unknown token", headers={"WWW-Authenticate": "Bearer"}
        )

    return Depends(check)


@dataclass(frozen=True)
class WorkerCaller:
    """A worker-side request: the state, the worker its token identifies (None: the enrolment token) and
    that token's digest (what the claim re-checks in its transaction)."""

    state: AppState
    worker_id: int | None
    token_hash: str | None = None

    def owns(self, worker_id: int | None) -> None:
        """403 unless the caller is that worker: a worker acts only on itself."""
        if worker_id is None or worker_id != self.worker_id:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"this worker token belongs to worker {self.worker_id}; a worker reports only on itself "
                "and on the attempts it claimed",
            )


def no_attempt(attempt_id: int) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"no attempt {attempt_id} held by this worker")


def _require_worker(enrolment: bool) -> Any:
    async def check(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> WorkerCaller:
        state: AppState = request.app.state.flightdeck
        token = _credentials(credentials)
        identity = await state.identities.worker_of(token)
        if identity is not None:
            return WorkerCaller(state, *identity)
        found = state.tokens.scope_of(token)
        if found is Scope.worker:
            if enrolment:
                return WorkerCaller(state, None)
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                "the enrolment token only registers a worker (POST /workers); use the token its answer holds",
            )
        if found is Scope.user:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs a worker token, not a user token")
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "unknown token", headers={"WWW-Authenticate": "Bearer"}
        )

    return Depends(check)


# The application's state, for a caller holding a user token.
UserState = Annotated[AppState, _require_user()]
# POST /workers: the enrolment token (FLIGHTDECK_WORKER_TOKENS) or a worker's own token.
Enrolment = Annotated[WorkerCaller, _require_worker(enrolment=True)]
# Every other worker route: a registered worker's own token.
WorkerCall = Annotated[WorkerCaller, _require_worker(enrolment=False)]


async def json_body(request: Request) -> Any:
    """The request's JSON body, or a 4xx that says what is wrong with it."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() not in ("application/json", ""):
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
    body = await request.body()
    if not body:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "the body is empty; send a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"the body is not valid JSON: {exc}") from exc


JsonBody = Annotated[Any, Depends(json_body)]


async def recipe_body(request: Request) -> Any:
    """A body that holds a recipe: at most `max_recipe_bytes` (413 naming the limit), then JSON."""
    limit = request.app.state.flightdeck.settings.max_recipe_bytes
    body = await request.body()
    if len(body) > limit:
        raise HTTPException(
            status.HTTP_413_CONTENT_TOO_LARGE,
            f"the recipe is {len(body):,} bytes; at most {limit:,} are accepted "
            "(FLIGHTDECK_MAX_RECIPE_BYTES): keep data in files the recipe names, not in the recipe",
        )
    return await json_body(request)


RecipeBody = Annotated[Any, Depends(recipe_body)]


def json_object_schema(
    description: str, schema: dict[str, Any] | None = None, *, required: bool = True
) -> dict[str, Any]:
    """openapi_extra for routes that read their body themselves (for speed or for complete errors)."""
    return {
        "requestBody": {
            "required": required,
            "description": description,
            "content": {"application/json": {"schema": schema or {"type": "object"}}},
        }
    }


class Problem(BaseModel):
    """The body of every refusal that is not a validation error."""

    detail: str


def _refusal(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description}


# Documented on every route, so clients (and schemathesis) know each refusal is intended.
OPEN_REFUSALS: dict[int | str, dict[str, Any]] = {413: _refusal("the request body is over the size limit")}
AUTHENTICATED_REFUSALS: dict[int | str, dict[str, Any]] = {
    **OPEN_REFUSALS,
    400: _refusal("the body is not valid JSON"),
    401: _refusal("no token, or an unknown one"),
    403: _refusal("a token of the other scope"),
    404: _refusal("no such job, attempt or worker"),
    409: _refusal("the change conflicts with the current status"),
    415: _refusal("the body is not JSON"),
}
