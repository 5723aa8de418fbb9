"""The wire contract is defined once (service/contracts.py): the routes publish it, the agent builds with it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from service.api.app import create_app
from service.contracts import (
    MAX_TEXT,
    AttemptEvent,
    EventBatch,
    FinishReport,
    LogChunk,
    MetricBatch,
    attempt_event,
    encode_number,
    json_safe,
)
from service.core.config import Settings


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
    metrics = _request_schema(document, "/attempts/{attempt_id}/metrics")
    expected = MetricBatch.model_json_schema()
    assert metrics["required"] == expected["required"] == ["points"]
    assert set(metrics["$defs"]["MetricPoint"]["properties"]) == {"step", "values", "time"}


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
