"""metrics.jsonl lines: a step's flat record through the fast encoder, anything else as before, and
non-finite numbers always spelled as the contract says (never a silent null)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from flightdeck.worker.train.metrics_file import MetricsFile, encode_line, read_metrics


def test_a_step_and_an_event_read_back_as_written(tmp_path: Path) -> None:
    metrics = MetricsFile(tmp_path / "metrics.jsonl")
    values = {"loss": 2.5, "learning_rate": 1e-5, "grad_norm": 0.125, "tokens_per_second": None, "stage": 0}
    metrics.step(3, dict(values))
    metrics.event({"code": "G002", "severity": "fatal", "message": "dead — ünïcode", "data": {"n": [1, 2]}})
    # Flushed as written: the agent (and the stall watch) see a line as soon as it exists.
    step, event = read_metrics(tmp_path / "metrics.jsonl")
    metrics.close()
    assert step["type"] == "step" and step["step"] == 3 and isinstance(step["time"], float)
    assert {k: step[k] for k in values} == values
    assert event["message"] == "dead — ünïcode" and event["data"] == {"n": [1, 2]}


def test_non_finite_numbers_are_spelled_not_written_as_null() -> None:
    line = encode_line({"type": "step", "step": 1, "loss": float("nan"), "grad_norm": float("inf")})
    record = json.loads(line)
    assert (record["loss"], record["grad_norm"]) == ("NaN", "Infinity")
    nested = json.loads(encode_line({"type": "event", "data": {"loss": float("-inf")}}))
    assert nested["data"]["loss"] == "-Infinity"


def test_values_the_fast_encoder_does_not_take_go_through_json() -> None:
    assert json.loads(encode_line({"step": 2, "loss": np.float64(0.5), "flag": True})) == {
        "step": 2,
        "loss": 0.5,
        "flag": True,
    }
    assert json.loads(encode_line({"step": 2, "count": 2**70})) == {
        "step": 2,
        "count": 2**70,
    }  # flat, > 64 bits
    assert encode_line({"step": 1}).endswith(b"\n") and encode_line({"a": [1]}).endswith(b"\n")
