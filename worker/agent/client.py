"""HTTP client for the worker API of docs/contracts.md, with retries for an unreachable service.

The agent's edge: every body it sends is one of the contract's models (flightdeck/contracts.py), and every
answer it reads is validated into one once, here, so the rest of the agent works with typed values."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    stop_never,
    stop_when_event_set,
    wait_exponential,
)

from flightdeck.contracts import (
    AttemptNotRunning,
    Claimed,
    ClaimedAttempt,
    ClaimRequest,
    EventBatch,
    FinishReport,
    Heartbeat,
    HeartbeatAnswer,
    LogChunk,
    NameTaken,
    NodeReady,
    NodeStart,
    Registered,
    Registration,
)
from flightdeck.inventory import WorkerInventory

log = logging.getLogger("flightdeck.agent")
# The start barrier of a multi-node attempt long-polls: the answer comes the moment the last node is
# ready (polling every 0.5 s added 0.5 s to every multi-node start, bench/README.md).
NODE_READY_WAIT_SECONDS = 10


class Reports(Protocol):
    """What a run's shipping sends (worker/agent/shipping.py)."""

    def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None: ...
    def send_events(self, attempt_id: str, events: list[dict[str, Any]]) -> None: ...
    def send_log(
        self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None
    ) -> None: ...


class EndReports(Reports, Protocol):
    """Shipping and the finish report: what an executor carrying a node's outbox sends."""

    def finish(self, attempt_id: str, report: dict[str, Any]) -> dict[str, Any]: ...


class AttemptClient(EndReports, Protocol):
    """What an attempt runner sends: the service's client, or an outbox an executor carries
    (worker/agent/outbox.py)."""

    def node_ready(self, attempt_id: str, node_rank: int, port: int | None) -> NodeStart: ...


class ServiceUnavailable(Exception):
    """The service did not answer, or answered 5xx: worth retrying."""


def _log_retry(state: RetryCallState) -> None:
    """One line per retry naming the call (tenacity's own names the function, which a loop of tries has
    not: "Retrying <unknown>")."""
    failed = state.outcome.exception() if state.outcome is not None else None
    sleep = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning("%s; retrying in %.2f s (try %d)", failed, sleep, state.attempt_number)


class AttemptGone(Exception):
    """The service does not know the attempt (404)."""


class ServiceRefused(Exception):
    """A 4xx the agent cannot fix by retrying the same request (bad token, invalid or oversized body)."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.status_code = status_code


class BadAnswer(ServiceRefused):
    """The service answered 2xx with a body that is not the contract's (another version of it)."""


M = TypeVar("M", bound=BaseModel)


def _answer(model: type[M], response: httpx.Response, method: str, path: str) -> M:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise BadAnswer(
            f"{method} {path}: the answer is not a {model.__name__} ({exc.error_count()} errors: {exc})",
            response.status_code,
        ) from exc


class WorkerClient:
    """Calls the service; `stop` ends retry loops when the agent shuts down."""

    def __init__(self, base_url: str, token: str, stop: threading.Event | None = None, timeout: float = 30.0):
        self.stop = stop or threading.Event()
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    def close(self) -> None:
        self._http.close()

    def _request(
        self,
        method: str,
        path: str,
        body: BaseModel | dict[str, Any] | None,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        retry_for: float | None = None,
        conflict: type[Exception] = AttemptNotRunning,
    ) -> httpx.Response:
        """Send once per try; retry transport errors and 5xx for `retry_for` seconds (None: until stop).
        A 409 raises `conflict` with the status the service names."""
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        stop = stop_when_event_set(self.stop) | (
            stop_never if retry_for is None else stop_after_delay(retry_for)
        )
        for attempt in Retrying(
            stop=stop,
            wait=wait_exponential(multiplier=0.25, max=5),
            retry=retry_if_exception_type(ServiceUnavailable),
            before_sleep=_log_retry,
            reraise=True,
        ):
            with attempt:
                try:
                    kwargs: dict[str, Any] = {"params": params, "json": body}
                    if timeout is not None:
                        kwargs["timeout"] = timeout
                    response = self._http.request(method, path, **kwargs)
                except httpx.TransportError as exc:
                    raise ServiceUnavailable(f"{method} {path}: {exc!r}") from exc
                if response.status_code >= 500:
                    raise ServiceUnavailable(f"{method} {path}: HTTP {response.status_code}")
        return _checked(response, method, path, conflict)

    @property
    def token(self) -> str:
        return str(self._http.headers["Authorization"]).removeprefix("Bearer ")

    def use_token(self, token: str) -> None:
        """Authenticate every later call with `token` (this worker's own, once registered)."""
        self._http.headers["Authorization"] = f"Bearer {token}"

    def register(
        self, name: str, inventory: WorkerInventory, *, keep_token: bool = False, held: Sequence[str] = ()
    ) -> Registered:
        """`keep_token` and `held`: a restarted worker, with its own token, keeps it and its attempts."""
        body = Registration(
            name=name, inventory=inventory, keep_token=keep_token, held=[int(a) for a in held]
        )
        try:
            response = self._request("POST", "/workers", body, conflict=NameTaken)
        except NameTaken as exc:  # 409: another live worker holds the name
            raise ServiceRefused(f"POST /workers: the name {name!r} is taken ({exc})", 409) from exc
        return _answer(Registered, response, "POST", "/workers")

    def heartbeat(self, worker_id: str, attempts: list[str]) -> HeartbeatAnswer:
        path = f"/workers/{worker_id}/heartbeat"
        response = self._request("POST", path, Heartbeat(attempts=[int(a) for a in attempts]), retry_for=0)
        return _answer(HeartbeatAnswer, response, "POST", path)

    def claim(
        self, worker_id: str, devices: list[int], wait: float, nodes: int | None = None
    ) -> ClaimedAttempt | None:
        """`nodes`: for a worker of several nodes, how many have `devices` free."""
        path = f"/workers/{worker_id}/claim"
        body = ClaimRequest(devices=devices, nodes=nodes)
        response = self._request("POST", path, body, params={"wait": wait}, timeout=wait + 15)
        if response.status_code == 204:
            return None
        return _answer(Claimed, response, "POST", path).attempt

    def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
        self._request("POST", f"/attempts/{attempt_id}/metrics", {"points": points})

    def send_events(self, attempt_id: str, events: list[dict[str, Any]]) -> None:
        path = f"/attempts/{attempt_id}/events"
        self._request("POST", path, _body(EventBatch, {"events": events}, path))

    def send_log(self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None) -> None:
        """`length`: the chunk's bytes in output.log, which differ from `text` where bytes were replaced;
        `node`: whose log, for a worker holding several nodes of the attempt."""
        chunk = LogChunk(offset=offset, text=text, length=length, node=node)
        self._request("POST", f"/attempts/{attempt_id}/logs", chunk)

    def release(self, attempt_id: str) -> dict[str, Any]:
        """Hand back an attempt this agent will not run; the job is queued again, no attempt spent."""
        return self._request("POST", f"/attempts/{attempt_id}/release", None, retry_for=10).json()  # type: ignore[no-any-return]

    def node_ready(self, attempt_id: str, node_rank: int, port: int | None) -> NodeStart:
        """Report this node ready to start (node 0 with its rendezvous port); the answer says whether
        every node is (`start`) or why the attempt stops (`abort`)."""
        path = f"/attempts/{attempt_id}/nodes/{node_rank}/ready?wait={NODE_READY_WAIT_SECONDS}"
        return _answer(NodeStart, self._request("POST", path, NodeReady(port=port)), "POST", path)

    def finish(self, attempt_id: str, report: dict[str, Any]) -> dict[str, Any]:
        """`report`: FinishReport's fields (ServiceRefused, as a 422 would be, when they are not one)."""
        path = f"/attempts/{attempt_id}/finish"
        return self._request("POST", path, _body(FinishReport, report, path)).json()  # type: ignore[no-any-return]


def _body(model: type[M], data: dict[str, Any], path: str) -> M:
    """`data` as the contract's model; a body the service would refuse (422) is refused here alike."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ServiceRefused(f"POST {path}: not a valid {model.__name__}: {exc}", 422) from exc


def _checked(response: httpx.Response, method: str, path: str, conflict: type[Exception]) -> httpx.Response:
    if response.status_code < 400:
        return response
    if response.status_code == 404:
        raise AttemptGone(f"{method} {path}: not found")
    if response.status_code == 409:
        raise conflict(_status_of(response))
    raise ServiceRefused(
        f"{method} {path}: HTTP {response.status_code} {response.text[:500]}", response.status_code
    )


def _status_of(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return "unknown"
    if isinstance(body, dict):
        detail = body.get("detail", body)
        if isinstance(detail, dict):
            return str(detail.get("status") or detail.get("attempt_status") or "unknown")
        return str(body.get("status") or detail)
    return "unknown"
