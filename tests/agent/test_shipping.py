"""Tailing with a durable cursor: whole lines only, resumes after a restart, re-sends identically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from flightdeck.service.reports.metric_batch import parse_metric_batch
from flightdeck.worker.agent.client import ServiceRefused, ServiceUnavailable, WorkerClient
from flightdeck.worker.agent.shipping import RunShipper, ShippingRefused, point_from_record
from flightdeck.worker.train.metrics_file import MetricsFile


class Recorder:
    """The service side of shipping, recorded; `fail_next` makes the next call fail like a down service."""

    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.logs: list[tuple[int, str]] = []
        self.lengths: list[int] = []
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

    def send_log(self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None) -> None:
        self._maybe_fail()
        self.logs.append((offset, text))
        self.lengths.append(length)


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


def test_an_unprocessable_batch_is_skipped_but_its_window_events_are_sent(tmp_path: Path) -> None:
    class Refusing(Recorder):
        def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
            if any(p["step"] == 1 for p in points):
                raise ServiceRefused("HTTP 422", 422)
            super().send_metrics(attempt_id, points)

    sink = Refusing()
    shipper = RunShipper(tmp_path, "a1", sink)
    event = {"type": "event", "step": 1, "code": "G002", "severity": "fix", "message": "m"}
    _append(tmp_path / "metrics.jsonl", _step(1, 1.0) + json.dumps(event) + "\n")
    shipper.drain()
    _append(tmp_path / "metrics.jsonl", _step(2, 0.5))
    shipper.drain()
    assert [p["step"] for p in sink.points] == [2]
    assert [(e["code"], e["severity"]) for e in sink.events] == [("G002", "fix")]


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_stops_shipping_without_losing_anything(tmp_path: Path, status: int) -> None:
    class Unauthorised(Recorder):
        refuse = True

        def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
            if self.refuse:
                raise ServiceRefused(f"HTTP {status}", status)
            super().send_metrics(attempt_id, points)

        def send_log(
            self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None
        ) -> None:
            if self.refuse:
                raise ServiceRefused(f"HTTP {status}", status)
            super().send_log(attempt_id, offset, text, length)

    sink = Unauthorised()
    _append(tmp_path / "metrics.jsonl", _step(1, 1.0))
    _append(tmp_path / "output.log", "one\n")
    with pytest.raises(ShippingRefused):
        RunShipper(tmp_path, "a1", sink).ship()
    with pytest.raises(ShippingRefused):
        RunShipper(tmp_path, "a1", sink).ship()
    sink.refuse = False  # the token was fixed; a restarted agent resumes from the durable cursor
    RunShipper(tmp_path, "a1", sink).drain()
    assert [p["step"] for p in sink.points] == [1]
    assert sink.logs == [(0, "one\n")]


def test_a_too_large_batch_is_sent_again_in_smaller_ones(tmp_path: Path) -> None:
    class Limited(Recorder):
        def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
            if len(points) > 2:
                raise ServiceRefused("HTTP 413", 413)
            super().send_metrics(attempt_id, points)

        def send_log(
            self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None
        ) -> None:
            if length > 8:
                raise ServiceRefused("HTTP 413", 413)
            super().send_log(attempt_id, offset, text, length)

    sink = Limited()
    for step in range(7):
        _append(tmp_path / "metrics.jsonl", _step(step, 1.0))
    _append(tmp_path / "output.log", "a\nbb\nccc\ndddd\neeeee\n")
    RunShipper(tmp_path, "a1", sink).drain()
    assert [p["step"] for p in sink.points] == list(range(7))
    assert "".join(text for _, text in sink.logs) == "a\nbb\nccc\ndddd\neeeee\n"
    assert [offset for offset, _ in sink.logs] == [0, *_running_sums(sink.lengths)[:-1]]


def _running_sums(lengths: list[int]) -> list[int]:
    sums, total = [], 0
    for length in lengths:
        total += length
        sums.append(total)
    return sums


def test_log_chunks_carry_their_byte_length_in_the_file(tmp_path: Path) -> None:
    sink = Recorder()
    (tmp_path / "output.log").write_bytes(b"ok \xff\xfe bytes\nnext\n")
    RunShipper(tmp_path, "a1", sink).drain()
    [(_, text)] = sink.logs
    assert sink.lengths == [len(b"ok \xff\xfe bytes\nnext\n")] != [len(text.encode())]


def test_the_client_sends_the_log_length() -> None:
    seen: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"offset": 0})

    client = WorkerClient("http://service", "t")
    client._http = httpx.Client(base_url="http://service", transport=httpx.MockTransport(answer))
    client.send_log("7", 10, "ok \ufffd\n", 5)
    client.send_log("7", 0, "node one\n", 9, node=1)
    assert seen == [
        {"offset": 10, "text": "ok \ufffd\n", "length": 5, "node": None},
        {"offset": 0, "text": "node one\n", "length": 9, "node": 1},
    ]


def test_a_node_that_ships_only_its_log_names_its_node_and_sends_no_metrics(tmp_path: Path) -> None:
    """A scheduled job's node after the first (the Slurm executor's runner there): rank 0, who writes
    the metrics, is on node 0, so anything in a metrics file here is not this node's to send."""
    sent: list[tuple[int, int | None]] = []

    class Sink(Recorder):
        def send_log(
            self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None
        ) -> None:
            sent.append((offset, node))

    sink = Sink()
    (tmp_path / "output.log").write_text("node one\n")
    (tmp_path / "metrics.jsonl").write_text('{"type": "step", "step": 1, "loss": 1.0}\n')
    RunShipper(tmp_path, "a1", sink, node=1, metrics=False).drain()
    assert sent == [(0, 1)] and sink.points == []


def test_trainer_metrics_lines_round_trip_through_the_service_parser(tmp_path: Path) -> None:
    # Real MetricsFile lines -> the shipper's points -> the service's own parser, with no fake between.
    metrics = MetricsFile(tmp_path / "metrics.jsonl")
    metrics.step(1, {"epoch": 0.1, "loss": 2.5, "grad_norm": math.nan, "learning_rate": 1e-4, "stage": 0})
    metrics.step(2, {"loss": math.inf, "grad_norm": None, "tokens_per_second": 1234.0, "stage": 0})
    metrics.write({"type": "step", "step": 3, "time": None, "loss": -math.inf})
    metrics.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    points = [point_from_record(json.loads(line)) for line in lines]
    assert "time" not in points[2]  # a line without a time sends no "time" key, not null
    batch = parse_metric_batch(json.dumps({"points": points}, allow_nan=False).encode())
    steps, values, _ = batch.series["loss"]
    assert steps == [1, 2, 3]
    assert values[0] == 2.5 and values[1] == math.inf and values[2] == -math.inf
    assert batch.series["grad_norm"][0] == [1]  # NaN kept as a point; null dropped
    assert set(batch.series) == {"epoch", "loss", "grad_norm", "learning_rate", "stage", "tokens_per_second"}
