"""Stopping an agent that waits for work: SIGTERM (`docker compose stop`, systemd, Ctrl-C) ends its claim
long-poll at once instead of when the poll's wait runs out (20 s by default), and the service claims
nothing for it afterwards."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from .processes import (
    FLIGHTDECK,
    WORKER_TOKEN,
    Agent,
    Managed,
    Service,
    _base_env,
    free_tcp_port,
    tiny_recipe,
    wait_until,
)
from .test_end_to_end import _submit

POLL_WAIT = 30.0  # the agent's claim long-polls this long: a stop that waited for it would show


def test_an_idle_agent_stops_at_once_and_a_job_queued_after_it_is_not_claimed_for_it(cluster: Any) -> None:
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "idle", poll_wait=POLL_WAIT)
    wait_until(lambda: "registered as idle" in agent.log(), 60, f"the agent to register\n{agent.log()}")
    time.sleep(2.0)  # inside its first long-poll, which answers only after POLL_WAIT with no job
    assert agent.proc is not None and agent.proc.poll() is None, agent.log()

    asked = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    code = agent.proc.wait(POLL_WAIT)
    took = time.monotonic() - asked

    assert code == 0, agent.log()[-3000:]
    assert took < 5.0, f"the agent took {took:.1f} s to stop (its poll had {POLL_WAIT - 2:.0f} s left)"
    assert "stopping: running attempts are stopped" in agent.log()
    assert "Traceback" not in agent.log(), agent.log()[-3000:]
    # Its abandoned poll may still be waiting on the service's side: the job must not go to it.
    api = service.api()
    job_id = _submit(api, tiny_recipe(max_steps=2))
    time.sleep(1.0)
    job = api.get(f"/jobs/{job_id}").json()
    assert (job["status"], job["attempts"]) == ("queued", []), job


def test_an_agent_stopped_before_the_service_ever_answered_exits_cleanly(tmp_path: Path) -> None:
    """A worker started before its service (compose, systemd) retries its registration until stopped;
    stopped then, it ends with exit 0 and its log says which call it was retrying, with no traceback."""
    unreachable = f"http://127.0.0.1:{free_tcp_port()}"  # nothing listens there
    argv = [FLIGHTDECK, "worker", "--workspace", str(tmp_path), "--service", unreachable, "--cpu-slots", "1"]
    agent = Managed(argv, _base_env(FLIGHTDECK_WORKER_TOKEN=WORKER_TOKEN), tmp_path / "agent.log")
    agent.start()
    try:
        log = wait_until(lambda: agent.log().count("retrying in") >= 2 and agent.log(), 60, "retries")
        assert "POST /workers: ConnectError" in log and "<unknown>" not in log, log
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGTERM)
        code = agent.proc.wait(30)
    finally:
        agent.stop()
    assert code == 0, agent.log()[-3000:]
    assert "Traceback" not in agent.log(), agent.log()[-3000:]
    assert "stopped before the service answered" in agent.log()
