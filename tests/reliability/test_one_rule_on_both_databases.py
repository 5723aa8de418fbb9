"""Input the two databases once answered differently, and input that once took the service down:
NUL in free text is replaced and in names refused, on SQLite and PostgreSQL alike; metric names per
attempt are bounded, and reads stay bounded whatever is stored; a deeply nested recipe is a 422."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from flightdeck.recipe.nul import NUL_REPLACEMENT
from flightdeck.service.core.config import Settings
from tests.reliability.conftest import World, build_world
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER, cpu_inventory, recipe


def _paths(answer: Any) -> list[str]:
    body = answer.json()
    if "findings" in body:
        return [f["path"] for f in body["findings"]]
    return [".".join(str(p) for p in e["loc"]) for e in body["detail"]]


def test_nul_in_free_text_is_replaced_on_both_databases(client: TestClient, world: World) -> None:
    events = {
        "events": [
            {
                "key": "e-nul",
                "kind": "health",
                "severity": "warn",
                "message": "loss \x00 line",
                "fix": "lower \x00 it",
                "data": {"tail\x00": ["a\x00b", {"deep": "c\x00"}]},
            }
        ]
    }
    answer = client.post(f"/attempts/{world.attempt_id}/events", json=events, headers=world.worker_a)
    assert answer.status_code == 200, answer.text
    stored = client.get(f"/jobs/{world.job_id}/events", headers=USER).json()["events"]
    event = next(e for e in stored if e["message"].startswith("loss "))
    assert (
        event["message"] == f"loss {NUL_REPLACEMENT} line" and event["fix"] == f"lower {NUL_REPLACEMENT} it"
    )
    assert event["data"] == {
        f"tail{NUL_REPLACEMENT}": [f"a{NUL_REPLACEMENT}b", {"deep": f"c{NUL_REPLACEMENT}"}]
    }
    finish = {
        "status": "succeeded",
        "exit_code": 0,
        "message": "done \x00",
        "log_tail": "training done \x00\n",
        "findings": [{"path": "data", "message": "m\x00", "severity": "warn", "value": "v\x00"}],
    }
    answer = client.post(f"/attempts/{world.attempt_id}/finish", json=finish, headers=world.worker_a)
    assert answer.status_code == 200, answer.text
    assert answer.json()["job_status"] == "succeeded"


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("events", {"events": [{"key": "k\x00", "kind": "x", "message": "m"}]}, "key"),
        ("events", {"events": [{"key": "k", "kind": "x\x00", "message": "m"}]}, "kind"),
        ("finish", {"status": "failed", "failure_class": "exit:1\x00"}, "failure_class"),
        ("finish", {"status": "failed", "output_path": "/runs/x\x00"}, "output_path"),
    ],
)
def test_nul_in_a_name_is_refused_naming_the_field(
    client: TestClient, world: World, route: str, body: dict[str, Any], field: str
) -> None:
    answer = client.post(f"/attempts/{world.attempt_id}/{route}", json=body, headers=world.worker_a)
    assert answer.status_code == 422, answer.text
    assert any(path.endswith(field) for path in _paths(answer)), answer.text
    assert "NUL" in answer.text


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"name": "job\x00name"}, "name"),
        ({"env": {"OMP_NUM_THREADS\x00": "1"}}, "env.OMP_NUM_THREADS\\0"),
    ],
)
def test_nul_in_a_recipe_is_refused_with_its_path(
    client: TestClient, change: dict[str, Any], path: str
) -> None:
    for route in ("/jobs", "/preflight"):
        answer = client.post(route, json=recipe(**change), headers=USER)
        assert answer.status_code == 422, answer.text
        assert path in _paths(answer), answer.text
    template = recipe()
    template["data"]["prompt_template"] = "Q: {question}\x00"
    answer = client.post("/jobs", json=template, headers=USER)
    assert answer.status_code == 422 and "data.prompt_template" in _paths(answer), answer.text


def test_nul_in_a_workers_inventory_is_refused(client: TestClient) -> None:
    body = {"name": "nul-host", "inventory": cpu_inventory() | {"hostname": "host\x00"}}
    answer = client.post("/workers", json=body, headers=WORKER)
    assert answer.status_code == 422 and any(p.endswith("hostname") for p in _paths(answer)), answer.text


def _deep(levels: int) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for _ in range(levels):
        nested = {"x": nested}
    return nested


@pytest.mark.parametrize("route", ["/jobs", "/preflight"])
def test_a_deeply_nested_recipe_is_refused_not_500(client: TestClient, route: str) -> None:
    body = recipe(stages=[{"model": _deep(500)}, {"data": _deep(500)}])
    answer = client.post(route, json=body, headers=USER)
    assert answer.status_code == 422, answer.text[:300]
    assert "nested deeper than" in answer.text


def _batch(keys: list[str], step: int = 1) -> dict[str, Any]:
    return {"points": [{"step": step, "values": dict.fromkeys(keys, 1.0), "time": 1.0}]}


@pytest.fixture
def small_key_limit(settings: Settings) -> Settings:
    return make_settings(settings.data_dir, database_url_override=settings.database_url, max_metric_keys=20)


def test_metric_names_per_attempt_are_bounded(small_key_limit: Settings) -> None:
    with TestClient(create_app_for(small_key_limit)) as client:
        world = build_world(client)
        url, auth = f"/attempts/{world.attempt_id}/metrics", world.worker_a
        # One point with more names than the limit: refused whole, naming the limit and the name.
        answer = client.post(url, json=_batch([f"m{i:03d}" for i in range(25)]), headers=auth)
        assert answer.status_code == 422 and "m020" in answer.text and "at most 20" in answer.text, (
            answer.text
        )
        # Batches of new names: accepted up to the limit, then the one that crosses it is refused.
        for start in (0, 8):
            answer = client.post(
                url, json=_batch([f"k{i:03d}" for i in range(start, start + 8)]), headers=auth
            )
            assert answer.status_code == 200, answer.text
        crossing = client.post(url, json=_batch([f"k{i:03d}" for i in range(16, 24)]), headers=auth)
        assert crossing.status_code == 422, crossing.text
        assert "k020" in crossing.text and "FLIGHTDECK_MAX_METRIC_KEYS" in crossing.text, crossing.text
        # Known names keep flowing; nothing of the refused batch was kept.
        assert client.post(url, json=_batch(["k000", "k015"], step=2), headers=auth).status_code == 200
        points = client.get(f"/jobs/{world.job_id}/metrics", headers=USER).json()["points"]
        assert {k for p in points for k in p["values"]} == {f"k{i:03d}" for i in range(16)}


def test_reads_stay_bounded_whatever_is_stored(small_key_limit: Settings) -> None:
    """Names stored before the limit existed (written straight into the tables here) are read only up
    to the limit: one page of metrics and the downsampled view answer at once."""
    from flightdeck.service.reports.metric_ingest import store_metrics

    with TestClient(create_app_for(small_key_limit)) as client:
        world = build_world(client)
        db = client.app.state.flightdeck.db  # type: ignore[attr-defined]
        for chunk in range(10):
            keys = [f"old{chunk:02d}_{i:04d}" for i in range(200)]
            points = [{"step": s, "values": dict.fromkeys(keys, float(s)), "time": 1.0} for s in range(3)]
            store_metrics(
                db, world.attempt_id, world.job_id, orjson.dumps({"points": points}), max_keys=10**6
            )
        page = client.get(f"/jobs/{world.job_id}/metrics", params={"after": -1, "limit": 1}, headers=USER)
        view = client.get(f"/jobs/{world.job_id}/metrics/downsampled", params={"buckets": 10}, headers=USER)
        assert page.status_code == view.status_code == 200
        # At most the limit's names are read (a query each): 100,000 once took one page 51 s.
        assert len(page.json()["points"][0]["values"]) == 20
        assert len(view.json()["series"]) == 20


def create_app_for(settings: Settings) -> Any:
    from flightdeck.service.api.app import create_app

    return create_app(settings)
