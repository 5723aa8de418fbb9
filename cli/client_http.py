"""The small HTTP client the user commands share: base URL, bearer token, errors a person can act on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import connect_sse
from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay

DEFAULT_URL = "http://127.0.0.1:8000"
# A 503 (the database restarting) changed nothing: the same request is sent again for this long.
BUSY_RETRY_SECONDS = 30.0


class ServiceError(Exception):
    """The service could not be reached or refused the request; the message says what to do."""

    def __init__(self, message: str, status: int | None = None, body: Any = None):
        super().__init__(message)
        self.status = status
        self.body = body


class RecipeRefused(ServiceError):
    """422 from POST /jobs or /preflight: every finding at once."""

    def __init__(self, message: str, findings: list[dict[str, Any]]):
        super().__init__(message, 422, {"findings": findings})
        self.findings = findings


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: Any
    id: str | None


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text.strip()[:500]


def _retry_after(state: RetryCallState) -> float:
    """The wait a 503's Retry-After asks for (1 to 10 s; 2 s when it names none)."""
    assert state.outcome is not None
    response: httpx.Response = state.outcome.result()
    try:
        return min(10.0, max(1.0, float(response.headers.get("retry-after", "2"))))
    except ValueError:
        return 2.0


def _last_answer(state: RetryCallState) -> httpx.Response:
    assert state.outcome is not None
    response: httpx.Response = state.outcome.result()
    return response


class UserClient:
    """One httpx.Client bound to the service URL with the user's token."""

    def __init__(
        self, url: str, token: str | None, timeout: float = 30.0, busy_retry: float = BUSY_RETRY_SECONDS
    ):
        self.busy_retry = busy_retry
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> UserClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params=params)

    def post(self, path: str, body: Any = None, **params: Any) -> Any:
        return self._call("POST", path, params=params, json=body)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        params = {k: v for k, v in kwargs.pop("params", {}).items() if v is not None}
        busy = Retrying(
            retry=retry_if_result(lambda r: r.status_code == 503),
            wait=_retry_after,
            stop=stop_after_delay(self.busy_retry),
            retry_error_callback=_last_answer,  # the last 503, reported below
        )
        try:
            response = busy(self._http.request, method, path, params=params, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        self._raise_for(response)
        return response.json() if response.content else None

    def _unreachable(self, exc: Exception) -> ServiceError:
        return ServiceError(
            f"cannot reach the Flightdeck service at {self.url} ({type(exc).__name__}: {exc}). "
            "Is `flightdeck serve` running there? Pass --url or set FLIGHTDECK_URL."
        )

    def _raise_for(self, response: httpx.Response) -> None:
        if response.is_success:
            return
        body = _body(response)
        detail = body.get("detail", body) if isinstance(body, dict) else body
        code = response.status_code
        if code == 401:
            raise ServiceError(
                f"the service refused the token ({detail}). Pass --token or set FLIGHTDECK_TOKEN to a user "
                "token (FLIGHTDECK_USER_TOKENS of the service, or <data-dir>/tokens.env).",
                code,
            )
        if code == 403:
            raise ServiceError(f"forbidden: {detail}. Use a user token, not a worker token.", code)
        if code == 422 and isinstance(body, dict) and "findings" in body:
            raise RecipeRefused(str(detail), body["findings"])
        raise ServiceError(
            f"{code} from {response.request.method} {response.request.url.path}: {detail}", code, detail
        )

    def stream(self, path: str, **params: Any) -> Iterator[SseEvent]:
        """Server-sent events from `path` (httpx-sse), as they arrive; their data is JSON."""
        params = {k: v for k, v in params.items() if v is not None}
        try:
            with connect_sse(
                self._http, "GET", path, params=params, timeout=httpx.Timeout(30.0, read=None)
            ) as source:
                if not source.response.is_success:
                    source.response.read()
                    self._raise_for(source.response)
                for sse in source.iter_sse():
                    yield SseEvent(sse.event, json.loads(sse.data), sse.id or None)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
