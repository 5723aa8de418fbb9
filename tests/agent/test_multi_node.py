"""Multi-node jobs for real on one host: two CPU agents (one slot each) on 127.0.0.1 run one torchrun
job with --nnodes 2 over gloo, each agent launching its own node rank."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from .processes import Agent, Service, wait_until
from .test_end_to_end import _gone, _job, _steps, _submit, _wait_status, _wait_training

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multinode-lora.json"


def _two_node_job(cluster: Any, prefix: str, **service_settings: Any) -> tuple[Service, dict[str, Agent]]:
    service: Service = cluster("service", **service_settings)
    agents = {name: cluster("agent", service, name, slots=1) for name in (f"{prefix}-a", f"{prefix}-b")}
    return service, agents


def _launched(agent: Agent) -> dict[str, Any]:
    [plan] = list(agent.runs_dir.glob("*/job-*/plan.json"))
    return json.loads(plan.read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_two_node_lora_job_runs_as_one_torchrun_job_over_two_agents(cluster: Any) -> None:
    service, agents = _two_node_job(cluster, "mn")
    api = service.api()
    recipe = json.loads(EXAMPLE.read_text())
    job_id = _submit(api, recipe)
    job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 240)
    logs = {name: agent.log()[-3000:] for name, agent in agents.items()}
    assert job["status"] == "succeeded", (job["failure_message"], logs)

    [attempt] = job["attempts"]
    nodes = attempt["nodes"]
    assert sorted(n["worker_name"] for n in nodes) == sorted(agents)
    assert [(n["node_rank"], n["status"], n["address"]) for n in nodes] == [
        (0, "succeeded", "127.0.0.1"),
        (1, "succeeded", "127.0.0.1"),
    ]
    # Each agent launched its own node of one rendezvous: same port, its own rank, WORLD_SIZE 2.
    launched = {n["node_rank"]: _launched(agents[n["worker_name"]]) for n in nodes}
    ports = set()
    for rank, plan in launched.items():
        argv = plan["argv"]
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--rdzv-backend") + 1] == "static"
        ports.add(next(v["value"] for v in plan["env"] if v["name"] == "MASTER_PORT"))
    assert len(ports) == 1 and ports.pop().isdigit()
    # Only global rank 0 reports metrics: every step once.
    assert _steps(api, job_id) == list(range(1, recipe["training"]["max_steps"] + 1))
    node_logs = [api.get(f"/jobs/{job_id}/logs", params={"node": rank}).json()["text"] for rank in (0, 1)]
    assert all(node_logs), "each node's output.log is shipped"
    # Node 1's process is global rank 1 of a world of 2 (static rendezvous, --node-rank 1).
    assert "[flightdeck] rank 1:" in node_logs[1] and "[flightdeck] rank 0:" in node_logs[0]
    events = api.get(f"/jobs/{job_id}/events").json()["events"]
    started = [e for e in events if e["message"].startswith("training started")]
    assert [e["data"]["world_size"] for e in started] == [2]
    for agent in agents.values():
        assert all(_gone(pid) for pid in agent.torchrun_pids())


@pytest.mark.slow
def test_a_killed_node_agent_stops_the_other_node_and_fails_the_attempt_naming_it(cluster: Any) -> None:
    service, agents = _two_node_job(cluster, "mnkill", lease_seconds=4)
    api = service.api()
    recipe = json.loads(EXAMPLE.read_text())
    recipe["training"]["max_steps"] = 100_000
    job_id = _submit(api, recipe, max_attempts=1)
    _wait_training(api, job_id, 2)
    nodes = _job(api, job_id)["attempts"][0]["nodes"]
    doomed, survivor = (agents[n["worker_name"]] for n in sorted(nodes, key=lambda n: -n["node_rank"]))
    [doomed_pgid], [survivor_pgid] = doomed.torchrun_pids(), survivor.torchrun_pids()
    killed_at = time.monotonic()
    doomed.kill()  # node 1's agent: SIGKILL, no clean-up of its own
    wait_until(lambda: _gone(doomed_pgid), 15, "node 1's orphaned torchrun to die (watchdog)")
    # Node 0's ranks would wait in a collective for a peer that is gone: they must be stopped too.
    wait_until(lambda: _gone(survivor_pgid), 4 + 30, "node 0's torchrun to stop")
    print(f"node 0 stopped {time.monotonic() - killed_at:.1f} s after node 1's agent was killed")
    job = _wait_status(api, job_id, {"failed", "succeeded", "cancelled", "queued"}, 30)
    assert job["status"] == "failed", job
    [attempt] = job["attempts"]
    assert attempt["message"].startswith("node 1 ("), attempt["message"]
    assert {n["node_rank"]: n["status"] for n in attempt["nodes"]}[1] == "lost"
