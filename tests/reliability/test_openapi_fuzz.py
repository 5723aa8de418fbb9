"""schemathesis against the service's own OpenAPI document: no 5xx, every answer matches the document.

The service is a real uvicorn on 127.0.0.1 that already holds a worker, a running attempt and a
cancelled job, so generated ids sometimes hit real rows. Each operation is called with the token its
scope needs (ROUTES in test_auth_matrix), so generated bodies reach the handlers instead of 401.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from service.api.app import create_app
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
# Streams end only when their job is terminal; a generated id that hits a live job would never return.
# They are covered by the auth matrix and tests/service instead.
_NOT_FUZZED = r"/stream$"

# The document as the app publishes it; building the app touches no disk before it starts.
schema = schemathesis.openapi.from_dict(create_app(make_settings(Path("unused"))).openapi()).exclude(
    path_regex=_NOT_FUZZED
)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("fuzz") / "data"
    # No long-polling claims: a fuzzed `wait` must not hold a test for minutes.
    with served(make_settings(data_dir, claim_max_wait_seconds=0)) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            build_world(client)
        yield url


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as shared:
        yield shared


def _token_for(method: str, path: str) -> dict[str, str]:
    who = ROUTES[(method, path)].who
    return {Who.user: USER, Who.worker: WORKER, Who.anyone: {}}[who]


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
