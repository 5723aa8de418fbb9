"""Tailing with a durable cursor: whole lines only, resumes after a restart, re-sends identically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from worker.agent.client import ServiceRefused, ServiceUnavailable
from worker.agent.shipping import RunShipper


class Recorder:
    """The service side of shipping, recorded; `fail_next` makes the next call fail like a down service."""

    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.logs: list[tuple[int, str]] = []
        self.fail_next = False

    def _maybe_fail(self) -> None:
        if self.fail_next:
            self.fail_next = False
            raise ServiceUnavailable("down")

    def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
        self._maybe_fail()
        self.points.extend(points)

    def send_events(self, attempt_id: str, events: list[dict[str, Any]]) -> None:
        self._maybe_fail()
        self.events.extend(events)

    def send_log(self, attempt_id: str, offset: int, text: str) -> None:
        self._maybe_fail()
        self.logs.append((offset, text))


def _append(path: Path, text: str) -> None:
    with open(path, "a") as out:
        out.write(text)


def _step(step: int, loss: float) -> str:
    return (
        json.dumps({"type": "step", "step": step, "time": 1.0 + step, "loss": loss, "grad_norm": None}) + "\n"
    )


def test_only_whole_lines_are_shipped_while_the_run_writes(tmp_path: Path) -> None:
    sink = Recorder()
    shipper = RunShipper(tmp_path, "a1", sink)
    _append(tmp_path / "output.log", "first line\nsecond li")
    _append(tmp_path / "metrics.jsonl", _step(1, 2.0) + '{"type": "step", "st')
    assert shipper.ship()
    assert sink.logs == [(0, "first line\n")]
    assert [p["step"] for p in sink.points] == [1]
    assert sink.points[0]["values"] == {"loss": 2.0}
    _append(tmp_path / "output.log", "ne\n")
    _append(tmp_path / "metrics.jsonl", 'ep": 2, "loss": NaN}\n')
    shipper.ship()
    assert sink.logs[-1] == (11, "second line\n")
    assert sink.points[-1]["values"] == {"loss": "NaN"}
    assert not shipper.ship()


def test_a_restarted_shipper_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    sink = Recorder()
    for step in range(5):
        _append(tmp_path / "metrics.jsonl", _step(step, 1.0 / (step + 1)))
    _append(tmp_path / "output.log", "a\nb\n")
    RunShipper(tmp_path, "a1", sink).drain()
    for step in range(5, 8):
        _append(tmp_path / "metrics.jsonl", _step(step, 0.1))
    _append(tmp_path / "output.log", "c\n")
    RunShipper(tmp_path, "a1", sink).drain()  # a new agent process: only the cursor file carries over
    assert [p["step"] for p in sink.points] == list(range(8))
    assert "".join(text for _, text in sink.logs) == "a\nb\nc\n"


def test_a_failed_send_is_repeated_with_the_same_offset_and_text(tmp_path: Path) -> None:
    sink = Recorder()
    _append(tmp_path / "output.log", "one\ntwo\n")
    sink.fail_next = True
    with pytest.raises(ServiceUnavailable):
        RunShipper(tmp_path, "a1", sink).ship()
    _append(tmp_path / "output.log", "three\n")  # more output while the service was down
    shipper = RunShipper(tmp_path, "a1", sink)  # the agent restarted
    shipper.drain()
    assert sink.logs == [(0, "one\ntwo\n"), (8, "three\n")]


def test_events_are_keyed_by_their_place_in_the_file(tmp_path: Path) -> None:
    sink = Recorder()
    event = {
        "type": "event",
        "time": 5.0,
        "step": 2,
        "code": "G002",
        "severity": "fatal",
        "message": "adapter gradients are zero",
        "fix": "re-enable them",
        "data": {"norm": math.inf},
    }
    _append(tmp_path / "metrics.jsonl", _step(1, 1.0) + json.dumps(event) + "\n")
    RunShipper(tmp_path, "a1", sink).drain()
    offset = len(_step(1, 1.0).encode())
    assert sink.events == [
        {
            "key": f"metrics.jsonl@{offset}",
            "kind": "health",
            "code": "G002",
            "severity": "fatal",
            "message": "adapter gradients are zero",
            "fix": "re-enable them",
            "step": 2,
            "data": {"norm": "Infinity"},
        }
    ]


def test_a_refused_batch_is_skipped_instead_of_blocking_the_rest(tmp_path: Path) -> None:
    class Refusing(Recorder):
        def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
            if any(p["step"] == 1 for p in points):
                raise ServiceRefused("HTTP 422")
            super().send_metrics(attempt_id, points)

    sink = Refusing()
    shipper = RunShipper(tmp_path, "a1", sink)
    _append(tmp_path / "metrics.jsonl", _step(1, 1.0))
    shipper.drain()
    _append(tmp_path / "metrics.jsonl", _step(2, 0.5))
    shipper.drain()
    assert [p["step"] for p in sink.points] == [2]
