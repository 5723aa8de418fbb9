"""The rollup tables behind the downsampled view give exactly what the stored points give."""

from __future__ import annotations

import random
from collections.abc import Iterator

import orjson
import pytest
from sqlalchemy import select

from flightdeck.contracts import encode_number
from flightdeck.service.core.db import Database
from flightdeck.service.core.tables import metric_points
from flightdeck.service.reports.metric_ingest import store_metrics
from flightdeck.service.reports.metric_reads import read_downsampled
from tests.metric_store import ATTEMPT, JOB, running_job_database


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with running_job_database(database_url) as database:
        yield database


def _send(db: Database, steps: list[int], values: dict[str, list[object]]) -> tuple[int, int]:
    points = [{"step": s, "values": {k: v[i] for k, v in values.items()}} for i, s in enumerate(steps)]
    return store_metrics(db, ATTEMPT, JOB, orjson.dumps({"points": points}))


def _stored(db: Database, key: str) -> list[tuple[int, float | None]]:
    p = metric_points.c
    with db.reading() as conn:
        rows = conn.execute(
            select(p.step, p.value).where(p.attempt_id == ATTEMPT, p.key == key).order_by(p.step)
        ).all()
    return [(int(r[0]), r[1]) for r in rows]


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


def test_metrics_at_different_levels_read_alone_as_they_read_together(db: Database) -> None:
    rng = random.Random(3)
    steps = list(range(5000))
    _send(db, steps, {"loss": [rng.random() for _ in steps], "lr": [1e-4] * len(steps)})
    sparse = list(range(0, 20_001, 100))  # few points over a wide span: a coarser level
    _send(db, sparse, {"tokens": [rng.random() for _ in sparse]})
    _send(db, list(range(20)), {"eval": [rng.random() for _ in range(20)]})  # short: from the points
    together = read_downsampled(db, ATTEMPT, None, 100)["series"]
    assert {key: s["bucket_width"] for key, s in together.items()} == {
        "eval": 1,
        "loss": 64,
        "lr": 64,
        "tokens": 256,
    }
    for key in together:
        assert read_downsampled(db, ATTEMPT, [key], 100)["series"] == {key: together[key]}
    subset = read_downsampled(db, ATTEMPT, ["tokens", "loss"], 100)["series"]
    assert subset == {"tokens": together["tokens"], "loss": together["loss"]}
    assert list(subset) == ["tokens", "loss"]  # in the order asked
    _check_against_points(db, 100)
