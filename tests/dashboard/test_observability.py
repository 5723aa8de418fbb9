"""GET /metrics (Prometheus) and the server-sent event streams, read over HTTP from a live service."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.cli.live_service import LiveService, live_service, minimal_recipe


def sample(text: str, name: str) -> float:
    """The value of one sample line (name with labels, exactly as exposed)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics:\n{text}")


def read_events(service: LiveService, path: str, **params: Any) -> list[tuple[str, Any]]:
    """Every event of one stream connection, until the service closes it."""
    found: list[tuple[str, Any]] = []
    name = "message"
    with service.user.stream("GET", path, params=params, timeout=httpx.Timeout(30, read=20)) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                found.append((name, json.loads(line.removeprefix("data: "))))
                name = "message"
    return found


def test_prometheus_metrics_count_jobs_workers_claims_points_and_requests(service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe("running"))
    assert service.worker.post("/workers/1/claim", json={}).status_code == 204  # nothing queued: empty claim
    service.submit(minimal_recipe("waiting-1"))
    cancelled = service.submit(minimal_recipe("waiting-2"))
    service.user.post(f"/jobs/{cancelled}/cancel")
    service.metrics(attempt_id, range(10))  # 5 values per step
    service.metrics(attempt_id, range(5, 12))  # 5 steps repeat: only 2 new steps count

    answer = httpx.get(service.url + "/metrics")  # no token: scraped by ops
    assert answer.status_code == 200
    text = answer.text
    assert sample(text, 'flightdeck_jobs{status="running"}') == 1
    assert sample(text, 'flightdeck_jobs{status="queued"}') == 1
    assert sample(text, 'flightdeck_jobs{status="cancelled"}') == 1
    assert sample(text, 'flightdeck_jobs{status="failed"}') == 0
    assert sample(text, "flightdeck_queue_depth") == 1
    assert sample(text, "flightdeck_running_attempts") == 1
    assert sample(text, "flightdeck_workers_alive") == 1
    assert sample(text, "flightdeck_metric_points_ingested_total") == 12 * 5
    assert sample(text, 'flightdeck_claim_duration_seconds_count{outcome="claimed"}') == 1
    assert sample(text, 'flightdeck_claim_duration_seconds_count{outcome="empty"}') == 1
    route = 'method="POST",route="/attempts/{attempt_id}/metrics",status="200"'
    assert sample(text, "flightdeck_request_duration_seconds_count{" + route + "}") == 2
    # Paths that match no route share one label: a scanner cannot create a series per URL.
    httpx.get(service.url + "/no/such/path/123")
    httpx.get(service.url + "/no/such/path/456")
    text = httpx.get(service.url + "/metrics").text
    unmatched = 'flightdeck_request_duration_seconds_count{method="GET",route="unmatched",status="404"}'
    assert sample(text, unmatched) == 2
    httpx.get(service.url + "/ui/static/js/api.js")
    text = httpx.get(service.url + "/metrics").text
    static = 'flightdeck_request_duration_seconds_count{method="GET",route="/ui/static",status="200"}'
    assert sample(text, static) == 1
    assert job_id == 1


def test_metrics_stream_sends_points_events_status_and_ends_when_the_job_ends(service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe())
    service.metrics(attempt_id, range(3))
    service.event(attempt_id, "h1", 1, "H001", "warn", "loss spiked")

    def later() -> None:
        time.sleep(0.8)
        service.metrics(attempt_id, range(3, 5))
        service.finish(attempt_id, status="failed", failure_code="G002", message="zero gradients")

    thread = threading.Thread(target=later)
    thread.start()
    events = read_events(service, f"/jobs/{job_id}/metrics/stream", after=0, keys="loss")
    thread.join()

    names = [name for name, _ in events]
    assert names[0] == "attempt" and names[-1] == "end"
    steps = [p["step"] for name, data in events if name == "metrics" for p in data["points"]]
    assert steps == [1, 2, 3, 4]  # after=0: step 0 is not sent again; each step once
    points = [p for name, data in events if name == "metrics" for p in data["points"]]
    assert all(set(p["values"]) == {"loss"} for p in points)
    health = [e for name, data in events if name == "events" for e in data["events"] if e["kind"] == "health"]
    assert [e["code"] for e in health] == ["H001"]
    statuses = [data["status"] for name, data in events if name == "status"]
    assert statuses == ["running", "failed"]
    # The job as GET /jobs lists it: its summary, nothing of the service's own columns.
    listed = service.user.get("/jobs").json()["data"][0]
    last_status = [data for name, data in events if name == "status"][-1]
    assert set(last_status) == set(listed) and last_status["findings_count"] == listed["findings_count"]
    assert events[-1][1]["status"] == "failed"


def test_log_stream_resumes_from_a_cursor_and_restarts_for_a_new_attempt(service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe())
    offset = service.log(attempt_id, 0, "one\n")
    service.log(attempt_id, offset, "two\n")
    service.finish(attempt_id, status="succeeded", exit_code=0)

    events = read_events(service, f"/jobs/{job_id}/logs/stream", offset=offset, attempt_id=attempt_id)
    assert "".join(d["text"] for n, d in events if n == "log") == "two\n"
    # A cursor that belongs to another attempt does not apply: the log is sent from its start.
    events = read_events(service, f"/jobs/{job_id}/logs/stream", offset=offset, attempt_id=attempt_id + 99)
    assert "".join(d["text"] for n, d in events if n == "log") == "one\ntwo\n"


def test_streams_close_after_their_lifetime_and_the_cli_reconnects(tmp_path: Path) -> None:
    with live_service(tmp_path / "short-streams", stream_seconds=0.3) as service:
        _streams_close_and_the_cli_reconnects(service)


def _streams_close_and_the_cli_reconnects(service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe())
    service.log(attempt_id, 0, "early\n")
    events = read_events(service, f"/jobs/{job_id}/logs/stream")
    assert [n for n, _ in events] == ["attempt", "log", "status"]  # closed without `end`

    from typer.testing import CliRunner

    from flightdeck.cli.main import app
    from tests.cli.live_service import USER_TOKEN

    def later() -> None:
        time.sleep(1.0)  # past several stream lifetimes
        service.log(attempt_id, len(b"early\n"), "late\n")
        service.finish(attempt_id, status="succeeded", exit_code=0)

    thread = threading.Thread(target=later)
    thread.start()
    result = CliRunner().invoke(app, ["logs", str(job_id), "-f", "--url", service.url, "--token", USER_TOKEN])
    thread.join()
    assert result.exit_code == 0, result.output
    assert result.output.count("early\n") == 1 and "late\n" in result.output


def test_streams_need_a_user_token_and_an_existing_job(service: LiveService) -> None:
    assert httpx.get(service.url + "/jobs/1/logs/stream").status_code == 401
    assert service.enrol.get("/jobs/1/metrics/stream").status_code == 403
    assert service.user.get("/jobs/999/metrics/stream").status_code == 404
