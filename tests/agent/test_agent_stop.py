"""Stopping an agent that waits for work: SIGTERM (`docker compose stop`, systemd, Ctrl-C) ends its claim
long-poll at once instead of when the poll's wait runs out (20 s by default), and the service claims
nothing for it afterwards."""

from __future__ import annotations

import signal
import time
from typing import Any

from .processes import Agent, Service, tiny_recipe, wait_until
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
