"""The wire contract is defined once (flightdeck/contracts.py): the routes publish it, the agent builds with it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

from flightdeck.contracts import (
    MAX_TEXT,
    AttemptEvent,
    EventBatch,
    FinishReport,
    LogChunk,
    attempt_event,
    encode_number,
    json_safe,
)
from flightdeck.service.api.app import create_app
from flightdeck.service.core.config import Settings
from tests.service.factories import USER, as_owner, recipe
from tests.service.test_worker_api import claim


def _request_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    return document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]  # type: ignore[no-any-return]


def test_the_attempt_routes_publish_the_contracts_models(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, user_tokens=["u"], worker_tokens=["w"]))
    document = app.openapi()
    refs = {
        "/attempts/{attempt_id}/events": EventBatch,
        "/attempts/{attempt_id}/logs": LogChunk,
        "/attempts/{attempt_id}/finish": FinishReport,
    }
    for path, model in refs.items():
        assert _request_schema(document, path) == {"$ref": f"#/components/schemas/{model.__name__}"}, path


# Bodies the metrics route (parsed by hand, not by the model) must judge as its published schema does.
_METRIC_BODIES = [
    ({"points": [{"step": 1, "values": {"loss": 0.5, "grad_norm": "NaN"}, "time": 1.0}]}, True),
    ({"points": [{"step": 2, "values": {"loss": None}}]}, True),
    ({"points": []}, True),
    ({}, False),
    ({"points": [{"values": {"loss": 1.0}}]}, False),
    ({"points": [{"step": -1, "values": {"loss": 1.0}}]}, False),
    ({"points": [{"step": 3}]}, False),
    ({"points": [{"step": 4, "values": {"loss": 1.0}, "time": "soon"}]}, False),
    ({"points": [{"step": 5, "values": ["loss", 1.0]}]}, False),
]


def test_the_hand_parsed_metrics_route_accepts_exactly_what_its_published_schema_does(
    client: TestClient, worker_id: int
) -> None:
    """The route reads its body by hand for speed and publishes MetricBatch's schema: a real request
    per body, judged against the schema the OpenAPI document carries (jsonschema), must agree."""
    published = _request_schema(client.app.openapi(), "/attempts/{attempt_id}/metrics")  # type: ignore[attr-defined]
    assert client.post("/jobs", json=recipe(), headers=USER).status_code == 201
    attempt = claim(client, worker_id)
    assert attempt is not None
    for body, valid in _METRIC_BODIES:
        errors = list(Draft202012Validator(published).iter_errors(body))
        assert (errors == []) is valid, (body, errors)
        answer = client.post(f"/attempts/{attempt['id']}/metrics", json=body, headers=as_owner(attempt))
        assert answer.status_code == (200 if valid else 422), (body, answer.text)


def test_the_one_event_builder_never_builds_what_the_route_refuses() -> None:
    event = attempt_event(
        "k" * 500,
        "launch",
        "m" * (MAX_TEXT + 10),
        code="not-a-code",
        severity="loud",
        step=-1,
        data={"x": math.nan},
    )
    parsed = AttemptEvent.model_validate(event)
    assert len(parsed.message) == MAX_TEXT and parsed.code is None and parsed.severity == "warn"
    assert parsed.step is None and parsed.data == {"x": "NaN"}


def test_non_finite_numbers_have_one_spelling() -> None:
    assert [encode_number(v) for v in (None, math.nan, math.inf, -math.inf, 1.5)] == [
        "NaN",
        "NaN",
        "Infinity",
        "-Infinity",
        1.5,
    ]
    assert json_safe({"a": [math.inf, (math.nan,)]}) == {"a": ["Infinity", ["NaN"]]}
