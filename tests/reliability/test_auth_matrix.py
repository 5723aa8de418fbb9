"""Every route x (no token, wrong token, user token, worker token) gives the documented answer.

The route list comes from the application itself, so a new route without a row in ROUTES fails
`test_every_route_has_a_row`; each row says who may call the route and what a valid call looks like.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Mount

from flightdeck.service.api.app import create_app
from flightdeck.service.api.routes.dashboard import STATIC_DIR
from tests.reliability.conftest import World, make_settings
from tests.service.factories import USER, WORKER, cpu_inventory, recipe


class Who(Enum):
    anyone = "anyone"
    user = "user"
    enrolment = "enrolment"  # POST /workers: the enrolment token registers
    worker = "worker"  # the worker that holds the attempt (or is the path's worker): worker A


@dataclass
class Row:
    """Who may call a route, and a valid call: URL, JSON body, query, and the status it answers."""

    who: Who
    url: Callable[[World], str]
    ok: int = 200
    body: Callable[[World], Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    # Undo what the allowed call left that would change later worlds (a job queued again).
    cleanup: Callable[[TestClient, World], Any] | None = None


def _static_file() -> str:
    found = sorted(p for p in STATIC_DIR.rglob("*") if p.is_file())
    assert found, f"no dashboard files under {STATIC_DIR}"
    return "/ui/static/" + found[0].relative_to(STATIC_DIR).as_posix()


def _unclaimable() -> dict[str, Any]:
    """A job no CPU worker can take, so it never changes what a later world's claim gets."""
    return recipe(name="matrix", resources={"gpus_per_node": 64, "accelerator": "gpu"})


_POINTS = {"points": [{"step": 1, "values": {"loss": 1.5}, "time": 1.0}]}
_EVENTS = {"events": [{"key": "e1", "kind": "health", "severity": "warn", "message": "m"}]}
_FINISH = {"status": "failed", "exit_code": 1, "failure_class": "exit:1", "message": "stopped by the test"}

ROUTES: dict[tuple[str, str], Row] = {
    ("GET", "/healthz"): Row(Who.anyone, lambda w: "/healthz"),
    ("GET", "/recipes/schema"): Row(Who.anyone, lambda w: "/recipes/schema"),
    ("GET", "/metrics"): Row(Who.anyone, lambda w: "/metrics"),
    ("GET", "/openapi.json"): Row(Who.anyone, lambda w: "/openapi.json"),
    ("GET", "/docs"): Row(Who.anyone, lambda w: "/docs"),
    ("GET", "/docs/oauth2-redirect"): Row(Who.anyone, lambda w: "/docs/oauth2-redirect"),
    ("GET", "/redoc"): Row(Who.anyone, lambda w: "/redoc"),
    ("GET", "/"): Row(Who.anyone, lambda w: "/"),
    ("GET", "/ui/jobs/{job_id}"): Row(Who.anyone, lambda w: f"/ui/jobs/{w.job_id}"),
    ("GET", "/ui/static"): Row(Who.anyone, lambda w: _static_file()),
    ("POST", "/jobs"): Row(Who.user, lambda w: "/jobs", 201, lambda w: _unclaimable()),
    ("GET", "/jobs"): Row(Who.user, lambda w: "/jobs"),
    ("GET", "/jobs/{job_id}"): Row(Who.user, lambda w: f"/jobs/{w.job_id}"),
    ("POST", "/jobs/{job_id}/cancel"): Row(Who.user, lambda w: f"/jobs/{w.job_id}/cancel", 202),
    ("GET", "/jobs/{job_id}/metrics"): Row(Who.user, lambda w: f"/jobs/{w.job_id}/metrics"),
    ("GET", "/jobs/{job_id}/metrics/series/{key}"): Row(
        Who.user, lambda w: f"/jobs/{w.job_id}/metrics/series/loss"
    ),
    ("GET", "/jobs/{job_id}/metrics/downsampled"): Row(
        Who.user, lambda w: f"/jobs/{w.job_id}/metrics/downsampled"
    ),
    ("GET", "/jobs/{job_id}/logs"): Row(Who.user, lambda w: f"/jobs/{w.job_id}/logs"),
    ("GET", "/jobs/{job_id}/events"): Row(Who.user, lambda w: f"/jobs/{w.job_id}/events"),
    # Streams end once the job is terminal, so they read the cancelled job.
    ("GET", "/jobs/{job_id}/logs/stream"): Row(Who.user, lambda w: f"/jobs/{w.finished_job_id}/logs/stream"),
    ("GET", "/jobs/{job_id}/metrics/stream"): Row(
        Who.user, lambda w: f"/jobs/{w.finished_job_id}/metrics/stream"
    ),
    ("POST", "/preflight"): Row(Who.user, lambda w: "/preflight", 200, lambda w: recipe()),
    ("GET", "/workers"): Row(Who.user, lambda w: "/workers"),
    # Revoking worker A loses its attempt (requeued): cancel the job so later worlds start clean.
    ("POST", "/workers/{worker_id}/revoke"): Row(
        Who.user,
        lambda w: f"/workers/{w.worker_id}/revoke",
        cleanup=lambda client, w: client.post(f"/jobs/{w.job_id}/cancel", headers=USER),
    ),
    ("POST", "/workers"): Row(
        Who.enrolment, lambda w: "/workers", 201, lambda w: {"name": "cpu-2", "inventory": cpu_inventory()}
    ),
    ("POST", "/workers/{worker_id}/heartbeat"): Row(
        Who.worker,
        lambda w: f"/workers/{w.worker_id}/heartbeat",
        200,
        lambda w: {"attempts": [w.attempt_id]},
    ),
    # The only queued job was claimed while building the world: nothing is left to claim.
    ("POST", "/workers/{worker_id}/claim"): Row(
        Who.worker, lambda w: f"/workers/{w.worker_id}/claim", 204, lambda w: {}, {"wait": 0}
    ),
    ("POST", "/attempts/{attempt_id}/metrics"): Row(
        Who.worker, lambda w: f"/attempts/{w.attempt_id}/metrics", 200, lambda w: _POINTS
    ),
    ("POST", "/attempts/{attempt_id}/events"): Row(
        Who.worker, lambda w: f"/attempts/{w.attempt_id}/events", 200, lambda w: _EVENTS
    ),
    ("POST", "/attempts/{attempt_id}/logs"): Row(
        Who.worker, lambda w: f"/attempts/{w.attempt_id}/logs", 200, lambda w: {"offset": 0, "text": "hi\n"}
    ),
    # The world's attempt has reported nothing yet: it can be handed back.
    ("POST", "/attempts/{attempt_id}/release"): Row(
        Who.worker,
        lambda w: f"/attempts/{w.attempt_id}/release",
        cleanup=lambda client, w: client.post(f"/jobs/{w.job_id}/cancel", headers=USER),
    ),
    # The world's attempt runs on one node: its worker passes authorisation and is told there is no
    # start barrier (tests/service/test_gangs.py has the multi-node answers).
    ("POST", "/attempts/{attempt_id}/nodes/{node_rank}/ready"): Row(
        Who.worker, lambda w: f"/attempts/{w.attempt_id}/nodes/0/ready", 409, lambda w: {"port": 29500}
    ),
    ("POST", "/attempts/{attempt_id}/finish"): Row(
        Who.worker, lambda w: f"/attempts/{w.attempt_id}/finish", 200, lambda w: _FINISH
    ),
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One service for the module (each test builds a world of its own in it); leases outlive the module."""
    settings = make_settings(tmp_path_factory.mktemp("auth") / "data", lease_seconds=3600)
    with TestClient(create_app(settings)) as shared:
        yield shared


def app_routes(app: FastAPI) -> Iterator[tuple[str, str]]:
    """(method, path) of every route the app serves, HEAD aside, walking included routers."""

    def walk(routes: list[Any], prefix: str) -> Iterator[tuple[str, str]]:
        for route in routes:
            included = getattr(route, "original_router", None)  # FastAPI >= 0.16x keeps routers whole
            if included is not None:
                yield from walk(included.routes, prefix + (route.include_context.prefix or ""))
            elif isinstance(route, Mount):
                yield "GET", prefix + route.path
            else:
                for method in sorted(route.methods or ()):
                    if method != "HEAD":
                        yield method, prefix + route.path

    yield from walk(list(app.routes), "")


def test_every_route_has_a_row(client: TestClient) -> None:
    served = set(app_routes(client.app))  # type: ignore[arg-type]
    missing = sorted(served - set(ROUTES))
    assert not missing, f"routes with no expected scope in ROUTES: {missing}; add a row for each"
    stale = sorted(set(ROUTES) - served)
    assert not stale, f"rows for routes the app no longer serves: {stale}"


def test_every_openapi_operation_is_served(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    operations = {(m.upper(), path) for path, item in document["paths"].items() for m in item}
    assert operations <= set(app_routes(client.app))  # type: ignore[arg-type]
    assert operations, "the OpenAPI document lists no operation"


_WRONG = {"Authorization": "Bearer not-a-token"}
_CALLERS = ("none", "wrong", "user", "enrolment", "worker A", "worker B")


def _tokens(world: World) -> dict[str, dict[str, str]]:
    """Every kind of caller: no token, a wrong one, a user, the enrolment token, worker A (the world's
    worker, which holds its attempt) and worker B (another registered worker)."""
    fixed = {"none": {}, "wrong": _WRONG, "user": USER, "enrolment": WORKER}
    return fixed | {"worker A": world.worker_a, "worker B": world.worker_b}


def _expected(who: Who, token: str, path: str) -> int | None:
    """The refusal a caller gets, or None where the call must go through."""
    if who is Who.anyone:
        return None
    if token in ("none", "wrong"):
        return 401
    if token == "worker B" and path.startswith("/attempts/{attempt_id}"):
        return 404  # another worker's attempt is answered as one that does not exist
    allowed = {Who.user: "user", Who.enrolment: "enrolment", Who.worker: "worker A"}[who]
    return None if token == allowed else 403


def _call(client: TestClient, method: str, row: Row, world: World, headers: dict[str, str]) -> Any:
    body = row.body(world) if row.body else None
    return client.request(method, row.url(world), json=body, params=row.params, headers=headers)


@pytest.mark.parametrize("route", sorted(ROUTES), ids=lambda r: f"{r[0]} {r[1]}")
def test_route_answers_each_kind_of_caller(client: TestClient, world: World, route: tuple[str, str]) -> None:
    method, path = route
    row = ROUTES[route]
    # Refusals first: they must change nothing, so the allowed call still finds the world intact.
    for token, headers in _tokens(world).items():
        refusal = _expected(row.who, token, path)
        if refusal is None:
            continue
        answer = _call(client, method, row, world, headers)
        assert answer.status_code == refusal, (token, answer.status_code, answer.text)
        if refusal == 401:
            assert answer.headers.get("www-authenticate") == "Bearer", token
    for token, headers in _tokens(world).items():
        if _expected(row.who, token, path) is not None:
            continue
        answer = _call(client, method, row, world, headers)
        assert answer.status_code == row.ok, (token, answer.status_code, answer.text[:500])
        if row.cleanup is not None:
            row.cleanup(client, world)
            break
        if row.ok == 201:  # a second create would hide a bug where the first went unnoticed
            break


def test_refused_calls_change_nothing(client: TestClient, world: World) -> None:
    """A worker cannot cancel or submit, a user cannot finish or claim: state is as before."""
    before = client.get(f"/jobs/{world.job_id}", headers=USER).json()
    jobs_before = client.get("/jobs", headers=USER).json()["count"]
    assert client.post(f"/jobs/{world.job_id}/cancel", headers=WORKER).status_code == 403
    assert client.post("/jobs", json=recipe(name="sneaky"), headers=WORKER).status_code == 403
    finish = client.post(f"/attempts/{world.attempt_id}/finish", json=_FINISH, headers=USER)
    assert finish.status_code == 403
    points = client.post(f"/attempts/{world.attempt_id}/metrics", json=_POINTS, headers=USER)
    assert points.status_code == 403
    assert client.post("/workers/1/claim", json={}, headers=USER).status_code == 403
    # Worker B cannot report on, finish or hand back worker A's attempt, nor heartbeat or claim as A.
    for url, body, refusal in (
        (f"/attempts/{world.attempt_id}/finish", _FINISH, 404),
        (f"/attempts/{world.attempt_id}/metrics", _POINTS, 404),
        (f"/attempts/{world.attempt_id}/events", _EVENTS, 404),
        (f"/attempts/{world.attempt_id}/logs", {"offset": 0, "text": "forged\n"}, 404),
        (f"/attempts/{world.attempt_id}/release", None, 404),
        (f"/attempts/{world.attempt_id}/nodes/0/ready", {"port": 29500}, 404),
        (f"/workers/{world.worker_id}/heartbeat", {"attempts": [world.attempt_id]}, 403),
        (f"/workers/{world.worker_id}/claim", {}, 403),
    ):
        assert client.post(url, json=body, headers=world.worker_b).status_code == refusal, url
    after = client.get(f"/jobs/{world.job_id}", headers=USER).json()
    assert after == before
    assert client.get("/jobs", headers=USER).json()["count"] == jobs_before
    assert client.get(f"/jobs/{world.job_id}/metrics", headers=USER).json()["points"] == []


@pytest.mark.parametrize(
    ("suffix", "body"),
    [
        ("finish", _FINISH),
        ("metrics", _POINTS),
        ("events", _EVENTS),
        ("logs", {"offset": 0, "text": "x\n"}),
        ("release", None),
        ("nodes/0/ready", {"port": 29500}),
    ],
)
def test_another_workers_attempt_is_answered_as_a_missing_one(
    client: TestClient, world: World, suffix: str, body: Any
) -> None:
    """Attempt ids reveal nothing to a worker: another's attempt and no attempt get the same answer."""
    missing = 987654
    theirs = client.post(f"/attempts/{world.attempt_id}/{suffix}", json=body, headers=world.worker_b)
    absent = client.post(f"/attempts/{missing}/{suffix}", json=body, headers=world.worker_b)
    assert theirs.status_code == absent.status_code == 404, (theirs.text, absent.text)
    assert theirs.json()["detail"].replace(str(world.attempt_id), "N") == absent.json()["detail"].replace(
        str(missing), "N"
    )


def test_a_refusal_does_not_reveal_whether_a_job_exists(client: TestClient, world: World) -> None:
    real = client.get(f"/jobs/{world.job_id}", headers=WORKER)
    unknown = client.get("/jobs/987654", headers=WORKER)
    assert (real.status_code, unknown.status_code) == (403, 403)
    assert real.json() == unknown.json()


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Bearer ",
        "bearer user-token-for-tests-but-longer",
        "Token user-token-for-tests",
        b"Bearer \xff\xfe-not-utf8",
        "Bearer " + "x" * 10_000,
    ],
    ids=["empty", "blank", "prefix-extended", "other-scheme", "undecodable", "huge"],
)
def test_malformed_authorization_is_401(client: TestClient, header: str | bytes) -> None:
    answer = client.get("/jobs", headers={"Authorization": header})
    assert answer.status_code == 401, answer.text
