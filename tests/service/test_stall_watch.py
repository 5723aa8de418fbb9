"""H003: the service notices a run whose steps stopped coming, warns, then has it stopped."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flightdeck.contracts import SCRIPT_END_EVENT, attempt_event
from flightdeck.service.api.app import create_app
from flightdeck.service.health_watch import detect_stalls
from tests.service.conftest import make_settings
from tests.service.factories import USER, WORKER, as_worker, cpu_inventory, enrolled, recipe

STEP = 0.1  # seconds between the reported steps; stall_factor 2 -> warn after 0.2 s, stop after 0.4 s


def _client(
    tmp_path: Path, database_url: str, stall_min_seconds: float, warn_floor: float = 0.0
) -> Iterator[TestClient]:
    settings = make_settings(
        tmp_path / "data",
        database_url_override=database_url,
        reaper_interval_seconds=0.1,
        stall_min_seconds=stall_min_seconds,
        stall_warn_min_seconds=warn_floor,
    )
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture
def quick_stop(tmp_path: Path, database_url: str) -> Iterator[TestClient]:
    yield from _client(tmp_path, database_url, stall_min_seconds=1.0)


@pytest.fixture
def warn_only(tmp_path: Path, database_url: str) -> Iterator[TestClient]:
    yield from _client(tmp_path, database_url, stall_min_seconds=600.0)


@pytest.fixture
def default_floor(tmp_path: Path, database_url: str) -> Iterator[TestClient]:
    yield from _client(tmp_path, database_url, stall_min_seconds=600.0, warn_floor=30.0)


def _running_attempt(
    client: TestClient,
    ages: list[float],
    max_steps: int | None = None,
    *,
    epochs: bool = False,
    stages: list[dict[str, object]] | None = None,
) -> dict[str, object]:
    """A claimed attempt whose steps 1..n happened `ages` seconds before they are posted.

    The times are taken after the submit and the claim: a slow first request (preflight's imports on a
    loaded machine) must not read as a silence after the last step. `epochs`: the recipe sets no
    max_steps, so epochs decide how long it runs.
    """
    body = recipe(health={"stall_factor": 2})
    if max_steps is not None:
        body["training"] = {**body.get("training", {}), "max_steps": max_steps}
    if epochs:
        body["training"] = {k: v for k, v in body["training"].items() if k != "max_steps"} | {"epochs": 2}
    if stages is not None:
        body["stages"] = stages
    assert client.post("/jobs", json=body, headers=USER).status_code == 201
    wid = enrolled(client.post("/workers", json={"name": "w", "inventory": cpu_inventory()}, headers=WORKER))
    attempt: dict[str, object] = client.post(f"/workers/{wid}/claim", json={}, headers=as_worker(wid)).json()[
        "attempt"
    ]
    attempt["worker_id"] = wid
    now = time.time()
    points = [{"step": i + 1, "values": {"loss": 2.0}, "time": now - age} for i, age in enumerate(ages)]
    stored = client.post(
        f"/attempts/{attempt['id']}/metrics", json={"points": points}, headers=as_worker(wid)
    )
    assert stored.status_code == 200 and stored.json()["accepted"] == len(points)
    return attempt


def _steps_until_now(step: float = STEP) -> list[float]:
    """Four steps `step` seconds apart, the last one just now."""
    return [3 * step, 2 * step, step, 0.0]


def _health_events(client: TestClient, job_id: object) -> list[dict[str, object]]:
    events = client.get(f"/jobs/{job_id}/events", headers=USER).json()["events"]
    return [e for e in events if e["code"] == "H003"]


def _wait(predicate: Callable[[], object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def _heartbeat(client: TestClient, attempt: dict[str, object]) -> list[int]:
    url = f"/workers/{attempt['worker_id']}/heartbeat"
    headers = as_worker(int(attempt["worker_id"]))  # type: ignore[call-overload]
    cancel: list[int] = client.post(url, json={"attempts": [attempt["id"]]}, headers=headers).json()["cancel"]
    return cancel


def test_a_long_silence_stops_the_run_and_fails_the_job_with_h003(quick_stop: TestClient) -> None:
    attempt = _running_attempt(quick_stop, _steps_until_now())
    _wait(lambda: any(e["severity"] == "fatal" for e in _health_events(quick_stop, attempt["job_id"])))
    assert _heartbeat(quick_stop, attempt) == [attempt["id"]]
    # The agent stops the run and reports it the way it reports any stop order.
    report = {
        "status": "cancelled",
        "failure_class": "cancelled",
        "message": "stopped on the service's order",
    }
    quick_stop.post(f"/attempts/{attempt['id']}/finish", json=report, headers=as_worker(attempt["worker_id"]))  # type: ignore[arg-type]
    job = quick_stop.get(f"/jobs/{attempt['job_id']}", headers=USER).json()
    assert job["status"] == "failed" and job["failure_code"] == "H003"
    assert job["failure_class"] == "health:H003" and "median step time" in job["failure_message"]


def test_a_silence_under_the_floor_only_warns_once(warn_only: TestClient) -> None:
    attempt = _running_attempt(warn_only, _steps_until_now())
    _wait(lambda: _health_events(warn_only, attempt["job_id"]))
    time.sleep(0.5)
    assert [e["severity"] for e in _health_events(warn_only, attempt["job_id"])] == ["warn"]
    assert _heartbeat(warn_only, attempt) == []


def test_silence_while_the_service_was_down_is_not_a_stall(warn_only: TestClient) -> None:
    """Regression: steps older than the service's start waited on the worker's disk, not in a hang."""
    attempt = _running_attempt(warn_only, [3600, 3599, 3598, 3597])  # an hour ago, a second apart
    db = warn_only.app.state.flightdeck.db  # type: ignore[attr-defined]
    assert detect_stalls(db, min_fatal_seconds=1.0, since=time.time()) == []
    assert _health_events(warn_only, attempt["job_id"]) == []


def test_steady_steps_raise_nothing(warn_only: TestClient) -> None:
    # Steps 1 s apart (a warning after 2 s of silence), then three more at that pace taken on arrival:
    # the margin for a scheduler hiccup on a loaded machine is 1.4 s. Half a second was once not
    # enough: a post to PostgreSQL in CI's default stage came after a warning.
    steady = 1.0
    attempt = _running_attempt(warn_only, _steps_until_now(steady))
    for step in (5, 6, 7):
        time.sleep(steady * 0.6)
        warn_only.post(
            f"/attempts/{attempt['id']}/metrics",
            json={"points": [{"step": step, "values": {"loss": 1.9}}]},
            headers=as_worker(int(attempt["worker_id"])),  # type: ignore[call-overload]
        )
    assert _health_events(warn_only, attempt["job_id"]) == []


def test_a_finding_is_void_if_the_job_changed_between_scan_and_write(database_url: str) -> None:
    """The scan runs without the write lock: a cancel or a new step in between voids its finding."""
    from sqlalchemy import text

    from flightdeck.inventory import WorkerInventory
    from flightdeck.service.claims import ClaimOrder, claim_next_job
    from flightdeck.service.core.db import Database, migrate
    from flightdeck.service.health_watch import _record
    from flightdeck.service.jobs import cancel_job, submit_job
    from flightdeck.service.registration import register_worker

    migrate(database_url)
    db = Database(database_url)
    inventory = WorkerInventory.model_validate(cpu_inventory())
    worker = register_worker(db, "w", inventory, caller=None, lease_seconds=60)[0].id or 0
    jobs = [submit_job(db, recipe(name=f"j{i}")).id or 0 for i in range(3)]
    attempts = [claim_next_job(db, ClaimOrder(worker, [0, 1]), 60).id for _ in jobs]  # type: ignore[union-attr]
    with db.writing() as conn:
        conn.execute(text("UPDATE jobs SET last_step = 7"))
    cancel_job(db, jobs[1])
    with db.writing() as conn:
        conn.execute(text("UPDATE jobs SET last_step = 8 WHERE id = :id"), {"id": jobs[2]})
    found = [(a, j, 7, "stall:7:fatal", "fatal", "no new step") for a, j in zip(attempts, jobs, strict=True)]
    # Only the first is as the scan saw it: the second was cancelled, the third stepped on.
    assert _record(db, found) == [attempts[0]]


def test_a_fast_run_pausing_a_second_is_no_stall(default_floor: TestClient) -> None:
    """Regression: healthy 30-step runs showed 'possible stall ... 13x the median step time' after 1 s."""
    attempt = _running_attempt(default_floor, _steps_until_now())
    time.sleep(1.0)  # 10x the median step time, far under the 30 s floor
    assert _health_events(default_floor, attempt["job_id"]) == []


def test_the_last_planned_step_is_not_a_stall(warn_only: TestClient) -> None:
    attempt = _running_attempt(warn_only, _steps_until_now(), max_steps=4)  # step 4 of 4: saving
    time.sleep(0.6)
    assert _health_events(warn_only, attempt["job_id"]) == []


# --- the end of a stage (final save, final evaluation, the next stage loading) is no stall ---------
# These call the scan directly with a clock far past the last step (a silence 100x the median, well
# over the 1 s stop floor), so no test here depends on how soon the background scan runs.


def _started(client: TestClient, attempt: dict[str, object], offset: int, max_steps: int) -> None:
    """The trainer's 'training started' event of a stage: its first step offset and the Trainer's
    max_steps (epochs x steps per epoch when epochs decide)."""
    event = {
        "key": f"metrics.jsonl@{offset}",
        "kind": "health",
        "severity": "info",
        "message": f"training started: 1,024 trainable parameters, {max_steps // 2} steps per epoch",
        "step": offset,
        "data": {"max_steps": max_steps, "steps_per_epoch": max_steps // 2, "wrapper": "PeftModel"},
    }
    posted = client.post(
        f"/attempts/{attempt['id']}/events",
        json={"events": [event]},
        headers=as_worker(int(attempt["worker_id"])),  # type: ignore[call-overload]
    )
    assert posted.status_code == 200, posted.text


def _scan_later(client: TestClient) -> list[int]:
    db = client.app.state.flightdeck.db  # type: ignore[attr-defined]
    return detect_stalls(db, min_fatal_seconds=1.0, since=0.0, now=time.time() + 10.0)


def test_the_last_step_of_an_epoch_based_run_is_not_a_stall(warn_only: TestClient) -> None:
    """Regression: only runs with max_steps in every stage were exempt at their end; an epoch-based
    run's final save was warned after 30 s and stopped after 300 s."""
    attempt = _running_attempt(warn_only, _steps_until_now(), epochs=True)
    _started(warn_only, attempt, offset=0, max_steps=4)  # 2 epochs x 2 steps: step 4 is the last
    assert _scan_later(warn_only) == []
    assert _health_events(warn_only, attempt["job_id"]) == []


def test_an_epoch_based_run_short_of_its_planned_steps_is_still_judged(warn_only: TestClient) -> None:
    attempt = _running_attempt(warn_only, _steps_until_now(), epochs=True)
    _started(warn_only, attempt, offset=0, max_steps=10)  # step 4 of 10: a silence here is a stall
    assert _scan_later(warn_only) == [attempt["id"]]


def test_the_gap_between_epoch_based_stages_is_not_a_stall(warn_only: TestClient) -> None:
    stages: list[dict[str, object]] = [{"name": "one"}, {"name": "two"}]
    attempt = _running_attempt(warn_only, _steps_until_now(), epochs=True, stages=stages)
    _started(warn_only, attempt, offset=0, max_steps=4)  # stage 1 ends at step 4; stage 2 loading
    assert _scan_later(warn_only) == []


def test_the_gap_between_stages_with_max_steps_is_not_a_stall(warn_only: TestClient) -> None:
    stages: list[dict[str, object]] = [{"training": {"max_steps": 4}}, {"training": {"max_steps": 6}}]
    _running_attempt(warn_only, _steps_until_now(), stages=stages)  # step 4 of 10: stage 1 done
    assert _scan_later(warn_only) == []


# --- H006: the agent's report of where the ranks were ----------------------------------------------


def test_a_stall_whose_ranks_were_apart_fails_with_h006_naming_each(quick_stop: TestClient) -> None:
    attempt = _running_attempt(quick_stop, _steps_until_now())
    _wait(lambda: any(e["severity"] == "fatal" for e in _health_events(quick_stop, attempt["job_id"])))
    ranks = (
        "rank 0 in `evaluate()` at train.py:57; rank 1 in `barrier` (torch/distributed/c10d.py:4811) "
        "from `main()` at train.py:80"
    )
    report = {
        "status": "cancelled",
        "failure_class": "cancelled",
        "message": "stopped",
        "ranks": ranks,
        "ranks_apart": True,
    }
    headers = as_worker(attempt["worker_id"])  # type: ignore[arg-type]
    assert (
        quick_stop.post(f"/attempts/{attempt['id']}/finish", json=report, headers=headers).status_code == 200
    )
    job = quick_stop.get(f"/jobs/{attempt['job_id']}", headers=USER).json()
    assert (job["status"], job["failure_code"], job["failure_class"]) == ("failed", "H006", "health:H006")
    assert job["failure_message"].startswith("stalled: no new step")
    assert job["failure_message"].endswith(f"; where the ranks were: {ranks}")
    assert "busy alone" in job["failure_fix"]


def test_a_run_whose_script_ended_on_every_rank_is_not_a_stall(warn_only: TestClient) -> None:
    """A script job hanging in teardown after its end is the agent's to end (H008), never H003."""
    attempt = _running_attempt(warn_only, _steps_until_now(), epochs=True)
    posted = warn_only.post(
        f"/attempts/{attempt['id']}/events",
        json={"events": [attempt_event(SCRIPT_END_EVENT, "run", "the script ended on every rank")]},
        headers=as_worker(int(attempt["worker_id"])),  # type: ignore[call-overload]
    )
    assert posted.status_code == 200, posted.text
    assert _scan_later(warn_only) == []
    assert _health_events(warn_only, attempt["job_id"]) == []
