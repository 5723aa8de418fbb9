"""The rollup tables behind the downsampled view give exactly what the stored points give."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from service.contracts import encode_number
from service.core.db import Database, migrate
from service.reports.metric_ingest import store_metrics
from service.reports.metric_reads import read_downsampled

ATTEMPT, JOB = 7, 3


@pytest.fixture
def db(tmp_path: Path) -> Database:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate(url)
    database = Database(url)
    with database.raw_write() as conn:
        conn.execute(
            "INSERT INTO jobs (id, name, status, priority, max_attempts, attempt_count, created_at, updated_at, "
            "recipe, effective_recipe, findings, req_accelerator, req_devices, req_min_capability, "
            "req_gpu_memory_mb) VALUES (?, 'j', 'running', 0, 1, 1, 0, 0, '{}', '{}', '[]', 'cpu', 1, 0, 0)",
            (JOB,),
        )
    return database


def _send(db: Database, steps: list[int], values: dict[str, list[object]]) -> tuple[int, int]:
    points = [{"step": s, "values": {k: v[i] for k, v in values.items()}} for i, s in enumerate(steps)]
    return store_metrics(db, ATTEMPT, JOB, orjson.dumps({"points": points}))


def _stored(db: Database, key: str) -> list[tuple[int, float | None]]:
    with db.raw_read() as conn:
        return conn.execute(
            "SELECT step, value FROM metric_points WHERE attempt_id = ? AND key = ? ORDER BY step",
            (ATTEMPT, key),
        ).fetchall()


def _check_against_points(db: Database, buckets: int) -> None:
    """Each bucket i covers the steps after bucket i-1's last step up to its own: compare with the points."""
    view = read_downsampled(db, ATTEMPT, None, buckets)["series"]
    for key, series in view.items():
        points = _stored(db, key)
        assert series["points"] == len(points)
        assert len(series["steps"]) <= buckets
        previous = -1
        for i, last_step in enumerate(series["steps"]):
            inside = [v for s, v in points if previous < s <= last_step]
            finite = [v for v in inside if v is not None]
            assert inside, f"{key}: bucket {i} is empty"
            assert series["min"][i] == (encode_number(min(finite)) if finite else "NaN")
            assert series["max"][i] == (encode_number(max(finite)) if finite else "NaN")
            assert series["last"][i] == encode_number(dict(points)[last_step])
            previous = last_step
        assert previous == points[-1][0]


def test_rollups_match_points_through_resends_gaps_and_non_finite_values(db: Database) -> None:
    rng = random.Random(5)
    step = 0
    for batch in range(40):
        steps = list(range(step, step + 97))
        if batch % 7 == 3:
            rng.shuffle(steps)  # out of order within a batch
        step += 97 + (500 if batch == 20 else 0)  # one gap in the run
        loss = [
            rng.choice([rng.random(), "NaN", "Infinity", None]) if s % 13 == 0 else rng.random()
            for s in steps
        ]
        norm = [rng.random() * 10 for _ in steps]
        _send(db, steps, {"loss": loss, "grad_norm": norm})
    # A resend overlapping old and new steps with other values: old points are kept, new ones added.
    accepted, duplicates = _send(db, list(range(step - 50, step + 50)), {"loss": [-5.0] * 100})
    assert (accepted, duplicates) == (50, 50)
    for buckets in (10, 37, 100, 1000, 10_000):
        _check_against_points(db, buckets)


def test_a_series_shorter_than_the_buckets_is_read_from_the_points(db: Database) -> None:
    _send(db, [0, 1, 2, 5], {"loss": [1.0, "Infinity", None, 0.5]})
    view = read_downsampled(db, ATTEMPT, ["loss"], 10)["series"]["loss"]
    assert view["bucket_width"] == 1
    assert view["max"] == [1.0, "Infinity", "NaN", 0.5]
    _check_against_points(db, 10)
