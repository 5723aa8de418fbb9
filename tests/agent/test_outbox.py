"""The outbox of a node with no route to the service, and the executor's relay of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flightdeck.contracts import AttemptNotRunning
from flightdeck.worker.agent import rundir
from flightdeck.worker.agent.outbox import EVENTS_FILE, OutboxClient, OutboxRelay


class Recorder:
    """The service as the relay sees it: every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.finished = False

    def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
        self.calls.append(("metrics", [p["step"] for p in points]))

    def send_events(self, attempt_id: str, events: list[dict[str, Any]]) -> None:
        self.calls.append(("events", [e["key"] for e in events]))

    def send_log(self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None) -> None:
        self.calls.append(("log", (node, text)))

    def finish(self, attempt_id: str, report: dict[str, Any]) -> dict[str, Any]:
        if self.finished:
            raise AttemptNotRunning("succeeded")
        self.finished = True
        self.calls.append(("finish", report["status"]))
        return {"job_status": report["status"]}


def _nodes(tmp_path: Path, count: int) -> list[Path]:
    dirs = [tmp_path / f"node{rank}" for rank in range(count)]
    for d in dirs:
        d.mkdir()
    return dirs


def test_events_go_once_in_order_whole_lines_only_and_a_new_relay_goes_on_where_the_last_stopped(
    tmp_path: Path,
) -> None:
    [run_dir] = _nodes(tmp_path, 1)
    outbox, service = OutboxClient(run_dir), Recorder()
    outbox.send_events("7", [{"key": "a"}])
    with open(run_dir / EVENTS_FILE, "a") as out:
        out.write(
            json.dumps({"attempt_id": "7", "events": [{"key": "half"}]})
        )  # no newline yet: being written
    OutboxRelay([run_dir], "7", service).relay()
    assert service.calls == [("events", ["a"])]
    with open(run_dir / EVENTS_FILE, "a") as out:
        out.write("\n")
    outbox.send_events("7", [{"key": "b"}, {"key": "c"}])
    OutboxRelay([run_dir], "7", service).relay()  # an executor restarted in between
    assert service.calls == [("events", ["a"]), ("events", ["half"]), ("events", ["b", "c"])]


def test_node_zero_reports_the_end_after_its_last_steps_and_another_node_only_its_failure(
    tmp_path: Path,
) -> None:
    node0, node1 = _nodes(tmp_path, 2)
    (node0 / "metrics.jsonl").write_text(
        "".join(json.dumps({"type": "step", "step": s, "loss": 1.0}) + "\n" for s in (1, 2))
    )
    (node1 / "output.log").write_text("node 1 says hello\n")
    OutboxClient(node1).finish("7", {"status": "succeeded"})
    service = Recorder()
    relay = OutboxRelay([node0, node1], "7", service)
    relay.relay()
    assert ("log", (1, "node 1 says hello\n")) in service.calls and not relay.reported()
    assert not any(kind == "finish" for kind, _ in service.calls)  # node 1's success is node 0's to say
    OutboxClient(node0).finish("7", {"status": "succeeded"})
    (node0 / "metrics.jsonl").open("a").write(json.dumps({"type": "step", "step": 3, "loss": 1.0}) + "\n")
    relay.relay()
    kinds = [kind for kind, _ in service.calls]
    assert kinds.index("finish") > max(i for i, k in enumerate(kinds) if k == "metrics")  # steps first
    assert [s for kind, steps in service.calls if kind == "metrics" for s in steps] == [1, 2, 3]
    assert relay.reported()
    relay.relay(final=True)
    assert [kind for kind, _ in service.calls].count("finish") == 1

    (tmp_path / "second").mkdir()
    failing = _nodes(tmp_path / "second", 2)
    OutboxClient(failing[1]).finish("8", {"status": "failed"})
    other = Recorder()
    OutboxRelay(failing, "8", other).relay()
    assert ("finish", "failed") in other.calls  # any node's failure ends the attempt


def test_another_attempts_outbox_in_a_run_directory_used_again_is_not_this_attempts(tmp_path: Path) -> None:
    """A run directory can outlive its attempt (a service on a new database numbers jobs from 1 again):
    the relay must not end the new attempt with the old one's report or send it the old events."""
    [run_dir] = _nodes(tmp_path, 1)
    old = OutboxClient(run_dir)
    old.send_events("3", [{"key": "old"}])
    old.finish("3", {"status": "failed"})
    service = Recorder()
    relay = OutboxRelay([run_dir], "9", service)
    relay.relay(final=True)
    assert service.calls == [] and not relay.reported()
    OutboxClient(run_dir).send_events("9", [{"key": "new"}])
    relay.relay()
    assert service.calls == [("events", ["new"])]


def test_a_run_directory_prepared_for_another_attempt_starts_with_an_empty_outbox(tmp_path: Path) -> None:
    rundir.prepare_run_dir(tmp_path, {"attempt_id": "3"}, {}, {})
    OutboxClient(tmp_path).send_events("3", [{"key": "old"}])
    OutboxClient(tmp_path).finish("3", {"status": "failed"})
    OutboxRelay([tmp_path], "3", Recorder()).relay()
    rundir.prepare_run_dir(tmp_path, {"attempt_id": "9"}, {}, {})
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("outbox", "finish"))) == []
