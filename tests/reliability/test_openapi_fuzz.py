"""schemathesis against the service's own OpenAPI document: no 5xx, every answer matches the document.

The service is a real uvicorn on 127.0.0.1 that already holds a worker, a running attempt and a
cancelled job, so generated ids sometimes hit real rows. Each operation is called with the token its
scope needs (ROUTES in test_auth_matrix), so generated bodies reach the handlers instead of 401.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from flightdeck.service.api.app import create_app
from tests.conftest import TEMPLATE_DB
from tests.reliability.conftest import build_world, make_settings, served
from tests.reliability.test_auth_matrix import ROUTES, Who
from tests.service.factories import USER, WORKER

MAX_EXAMPLES = 25
_EXCLUDED = [
    # Static preflight refuses some schema-valid recipes on purpose (422 with findings).
    checks.positive_data_acceptance,
    # pydantic's lax mode takes 0 for false and "1" for 1, which the JSON Schema does not; harmless.
    checks.negative_data_rejection,
    # Starlette answers 405 with the Allow of the first route on the path only (GET and POST /jobs are
    # two routes); a framework limit, not ours.
    checks.allow_header_conformance,
]
# The document as the app publishes it; building the app touches no disk before it starts. The
# server-sent-event streams are fuzzed too: the served app closes every stream after STREAM_SECONDS.
STREAM_SECONDS = 0.2
schema = schemathesis.openapi.from_dict(create_app(make_settings(Path("unused"))).openapi())


@pytest.fixture(
    scope="module",
    # Both databases: they once disagreed on NUL. PostgreSQL's run is in the slow set (CI runs both).
    params=["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.slow])],
)
def base_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("fuzz") / "data"
    database: dict[str, Any] = {}
    if request.param == "postgres":
        cluster = request.getfixturevalue("postgres_cluster")
        name = f"fuzz_{os.getpid()}"
        database["database_url_override"] = cluster.create_database(name, template=TEMPLATE_DB)
    # No long-polling claims: a fuzzed `wait` must not hold a test for minutes.
    fuzzed = make_settings(data_dir, claim_max_wait_seconds=0, stream_seconds=STREAM_SECONDS, **database)
    with served(fuzzed) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            _WORLD.append(build_world(client))
        yield url
    if database:
        cluster.drop_database(name)


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as shared:
        yield shared


# The served world's worker: worker routes are called with its own token (generated ids are often
# another worker's, which answers 403, as documented).
_WORLD: list[Any] = []


def _token_for(method: str, path: str) -> dict[str, str]:
    who = ROUTES[(method, path)].who
    return {Who.user: USER, Who.enrolment: WORKER, Who.worker: _WORLD[-1].worker_a, Who.anyone: {}}[who]


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,  # the same examples every run: a failure here is reproducible
)
def test_no_server_errors_and_answers_match_the_document(
    case: schemathesis.Case, base_url: str, session: requests.Session
) -> None:
    headers = _token_for(case.operation.method.upper(), case.operation.path)
    case.call_and_validate(
        base_url=base_url, session=session, headers=headers, timeout=30, excluded_checks=_EXCLUDED
    )


_FORGED = {
    "none": {},
    "wrong": {"Authorization": "Bearer not-a-token"},
    "malformed": {"Authorization": "Bearer"},
}


# In the slow run: 20 s of the default run's 6 minutes; every route's refusal of each forged token is
# also checked once per route, in the default run, by tests/reliability/test_auth_matrix.py. On SQLite
# only: a token is refused before the request reaches the database, and the database's half of the
# token lookup is the same statement on both (the main fuzz above runs on both databases).
@pytest.mark.slow
@pytest.mark.parametrize("base_url", ["sqlite"], indirect=True)
@schema.parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@pytest.mark.parametrize("forged", sorted(_FORGED))
def test_fuzzed_requests_without_a_valid_token_are_refused(
    case: schemathesis.Case, base_url: str, session: requests.Session, forged: str
) -> None:
    """Every route that needs a token answers 401 to generated requests with none, a wrong or a
    malformed one (never 5xx, never the data); public routes answer as they would."""
    response = case.call(base_url=base_url, session=session, headers=_FORGED[forged], timeout=30)
    assert response.status_code < 500, (case.operation.path, response.text[:500])
    method = case.operation.method.upper()
    if response.request.method != method:
        assert response.status_code == 405  # schemathesis also tries methods the route does not have
    elif ROUTES[(method, case.operation.path)].who != Who.anyone:
        # FastAPI decodes a body before any dependency runs, so a body that is not JSON at all is
        # refused (422 json_invalid) before the token is looked at; nothing is read or stored either way.
        unparsed = (response.status_code == 422 and '"json_invalid"' in response.text) or (
            response.status_code == 400 and "error parsing the body" in response.text
        )
        assert response.status_code == 401 or unparsed, (case.operation.path, forged, response.text[:300])
