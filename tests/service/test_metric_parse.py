"""The metric batch parser: the usual batch parsed metric by metric gives exactly what the value-by-value
parse gives, and everything else is left to the value-by-value parse, which names what is wrong."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from flightdeck.contracts import MAX_POINTS_PER_BATCH
from flightdeck.service.reports import metric_batch
from flightdeck.service.reports.bad_report import BadReport
from flightdeck.service.reports.metric_batch import _any_batch, _uniform_batch, parse_metric_batch

NOW = 1_790_000_000.5


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A point without a time gets the arrival time: one clock for both parses, so they compare."""
    monkeypatch.setattr(metric_batch.time, "time", lambda: NOW)


def _uniform_points(rng: random.Random) -> list[dict[str, Any]]:
    keys = rng.sample(
        ["loss", "grad_norm", "lr", "epoch", "eval/loss", "gpu.mem-mb", "tokens"], rng.randint(1, 7)
    )
    steps = list(range(rng.randint(0, 50), rng.randint(51, 120)))
    if rng.random() < 0.3:
        rng.shuffle(steps)  # out of order
    if rng.random() < 0.3:
        steps.append(steps[0])  # a step sent twice
    points = []
    for step in steps:
        values: dict[str, Any] = {}
        for key in keys:
            values[key] = rng.choice([rng.random() * 10, rng.randint(-5, 10**6), None, 0.0, -1e300, 3.5])
        point: dict[str, Any] = {"step": step, "values": values}
        stamp = rng.choice([NOW - 100.25, int(NOW) - 7, None, "absent"])
        if stamp != "absent":
            point["time"] = stamp
        points.append(point)
    return points


def test_a_uniform_batch_is_parsed_metric_by_metric_exactly_as_value_by_value() -> None:
    rng = random.Random(11)
    for _ in range(200):
        points = orjson.loads(orjson.dumps({"points": _uniform_points(rng)}))["points"]
        fast, general = _uniform_batch(points), _any_batch(points)
        assert fast is not None, "a uniform batch went to the value-by-value parse"
        assert fast.series == general.series
        assert fast.count == general.count
        assert [type(v) for s in fast.series.values() for v in s[1]] == [
            type(v) for s in general.series.values() for v in s[1]
        ]  # ints stored as floats by both


IRREGULAR: list[tuple[str, list[Any]]] = [
    (
        "metric names differ between points",
        [{"step": 0, "values": {"a": 1.0}}, {"step": 1, "values": {"b": 1.0}}],
    ),
    (
        "a non-finite value sent as text",
        [{"step": 0, "values": {"loss": "NaN"}}, {"step": 1, "values": {"loss": 1.0}}],
    ),
    ("a boolean value", [{"step": 0, "values": {"loss": True}}]),
    ("a value that is an object", [{"step": 0, "values": {"loss": {"x": 1}}}]),
    ("a boolean step", [{"step": True, "values": {"loss": 1.0}}]),
    ("a negative step", [{"step": -1, "values": {"loss": 1.0}}]),
    ("a time as text", [{"step": 0, "values": {"loss": 1.0}, "time": "now"}]),
    ("a metric name the API refuses", [{"step": 0, "values": {"9lives": 1.0}}]),
    ("a point that is not an object", [{"step": 0, "values": {"loss": 1.0}}, 7]),
    ("no values", [{"step": 0, "values": {}}]),
    ("values that are not an object", [{"step": 0, "values": [1.0]}]),
    ("no points", []),
]


@pytest.mark.parametrize("points", [p for _, p in IRREGULAR], ids=[name for name, _ in IRREGULAR])
def test_any_other_batch_is_left_to_the_value_by_value_parse(points: list[Any]) -> None:
    assert _uniform_batch(points) is None
    body = orjson.dumps({"points": points})
    try:
        expected: Any = _any_batch(points)
    except BadReport as exc:
        with pytest.raises(BadReport, match=str(exc).replace("[", r"\[").replace("]", r"\]")):
            parse_metric_batch(body)
    else:
        parsed = parse_metric_batch(body)
        assert (parsed.series, parsed.count) == (expected.series, expected.count)


def test_a_batch_over_the_limit_is_refused_by_name() -> None:
    keys = [f"m{i}" for i in range(100)]
    points = [{"step": s, "values": dict.fromkeys(keys, 1.0)} for s in range(MAX_POINTS_PER_BATCH // 100 + 1)]
    assert _uniform_batch(points) is None
    with pytest.raises(BadReport, match="at most"):
        parse_metric_batch(orjson.dumps({"points": points}))


def test_values_sent_as_text_still_parse_to_the_stored_non_finite_values() -> None:
    body = orjson.dumps(
        {"points": [{"step": 3, "values": {"loss": "Infinity", "lr": "NaN", "gn": "-Infinity"}}]}
    )
    series = parse_metric_batch(body).series
    assert series["loss"][1] == [float("inf")]
    assert series["lr"][1] == [None]  # NaN is stored as NULL
    assert series["gn"][1] == [float("-inf")]


def test_the_service_parses_a_uniform_batch_metric_by_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    def value_by_value(points: list[Any]) -> Any:
        raise AssertionError("a uniform batch went to the value-by-value parse")

    monkeypatch.setattr(metric_batch, "_any_batch", value_by_value)
    points = [{"step": s, "values": {"loss": 1.0 / (s + 1), "lr": 1e-4}, "time": NOW} for s in range(100)]
    batch = parse_metric_batch(orjson.dumps({"points": points}))
    assert batch.count == 200
    assert batch.series["loss"][0] == list(range(100))
