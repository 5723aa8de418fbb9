"""The claim route's fast path: well-formed claims served in plain ASGI, the rest by FastAPI.

Fifty agents claiming back to back spend most of the service's CPU in the framework, not in the
claim: routing, the exception and exit-stack layers, dependency solving and the request and
response objects cost about twice the claim's SQL (bench/README.md). This middleware answers a
claim that is exactly what the documented route accepts (a worker token, a worker id, `wait` in
range, a valid body) with the same claim loop, and hands everything else - a missing or wrong
token, a bad body or parameter, an unknown worker - to the FastAPI route, so every refusal keeps
the one shape and wording the route defines. It sits inside RequestMetrics, so claims are timed
and counted as before.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

import anyio
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import AppState
from service.api.routes.workers import (
    MAX_WAIT_SECONDS,
    MAX_WORKER_ID,
    claim_answer,
    claim_devices,
    serve_claim,
)
from service.claims import ClaimOrder

# Plain digits and plain decimals only: any other spelling (a sign, spaces, exponents, "inf") is
# left to FastAPI, whose parsing decides what it means.
_CLAIM_PATH = re.compile(r"/workers/(0|[1-9][0-9]{0,18})/claim")
_PLAIN_DECIMAL = re.compile(r"[0-9]{1,9}(\.[0-9]{0,9})?")
_JSON = [(b"content-type", b"application/json")]


class ClaimFastPath:
    """ASGI middleware in front of the claim route; see the module docstring."""

    def __init__(self, app: ASGIApp, claim_route: Any, max_bytes: int) -> None:
        self.app = app
        self.claim_route = claim_route  # put in the scope, as FastAPI does, so metrics label the claim
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/claim"):
            await self.app(scope, receive, send)
            return
        head = self._read_head(scope)
        if head is None:
            await self._defer(scope, receive, send)
            return
        body, complete = await self._read_body(receive)
        replay = _replaying(body, complete, receive)
        if not complete:
            await self._defer(scope, replay, send)
            return
        try:
            devices = claim_devices(body)
        except ValidationError:
            await self._defer(scope, replay, send)
            return
        worker_id, wait = head
        scope["route"] = self.claim_route
        try:
            claimed = await serve_claim(
                scope["app"].state.flightdeck,
                ClaimOrder(worker_id, devices),
                wait,
                lambda: _disconnected(receive),
            )
        except (LookupError, ValueError):  # an unknown worker or bad devices: the route answers (404, 422)
            await self._defer(scope, replay, send)
            return
        if claimed is None:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        payload = claim_answer(claimed)
        headers = [*_JSON, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _defer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Anything but a well-formed claim: the FastAPI route answers, refusals included."""
        await self.app(scope, receive, send)

    def _read_head(self, scope: Scope) -> tuple[int, float] | None:
        """The worker id and wait of a claim with a worker token, or None: FastAPI answers it."""
        matched = _CLAIM_PATH.fullmatch(scope["path"])
        if matched is None or scope.get("root_path"):
            return None
        worker_id = int(matched[1])
        if worker_id > MAX_WORKER_ID:
            return None
        state: AppState | None = getattr(scope["app"].state, "flightdeck", None)
        if state is None or _worker_of(state, scope) != worker_id:
            return None
        wait = 0.0
        query = scope.get("query_string", b"")
        if query:
            values = [v for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k == "wait"]
            if len(values) > 1:
                return None
            if values:
                if not _PLAIN_DECIMAL.fullmatch(values[0]):
                    return None
                wait = float(values[0])
                if wait > MAX_WAIT_SECONDS:
                    return None
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.max_bytes):
                return None
        return worker_id, wait

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool]:
        """The body, and whether it is all there (False: over the limit, or the client left)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks), False
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_bytes:
                return b"".join(chunks), False
            if not message.get("more_body", False):
                return b"".join(chunks), True


def _worker_of(state: AppState, scope: Scope) -> int | None:
    """The worker the first Authorization header identifies (parsed as FastAPI's HTTPBearer parses it,
    resolved by the route's own WorkerIdentities); anything else is the route's to answer."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, token = get_authorization_scheme_param(value.decode("latin-1"))
            return state.identities.worker_of(token) if scheme.lower() == "bearer" and token else None
    return None


def _replaying(body: bytes, complete: bool, receive: Receive) -> Receive:
    """A receive that gives the downstream app the body already read, then the rest of the stream."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replay


async def _disconnected(receive: Receive) -> bool:
    """Whether the client has gone, without waiting (Starlette's Request.is_disconnected, on `receive`):
    the body is read, so the only message that can be waiting is the disconnect."""
    with anyio.CancelScope() as scope:
        scope.cancel()
        message = await receive()
        return bool(message.get("type") == "http.disconnect")
    return False
