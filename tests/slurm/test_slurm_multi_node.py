"""Jobs of two nodes as ONE Slurm job of two nodes, for real: the Slurm worker offers the partition's two
nodes, claims the job whole (no Flightdeck gang), and srun starts a runner on each node that runs host
preflight there and one torchrun (2 gloo processes) with the node's rank and node 0's address from
the allocation: a world of 4 across the cluster's two network namespaces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..agent.conftest import EXAMPLES
from ..agent.processes import tiny_recipe
from ..agent.test_end_to_end import _steps, _submit, _wait_status, _wait_training
from .cluster import NODES, SlurmCluster
from .conftest import slurm_events

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
_DONE = {"succeeded", "failed", "cancelled"}


def _two_nodes(recipe: dict[str, Any]) -> dict[str, Any]:
    recipe["resources"] = {**recipe["resources"], "nodes": 2, "gpus_per_node": 2}
    return recipe


def _launched(run_dir: str) -> dict[str, str]:
    """The environment a node launched torchrun with (its plan.json, host facts filled in)."""
    plan = json.loads((Path(run_dir) / "plan.json").read_text())
    return {v["name"]: v["value"] for v in plan["env"]}


def _check_one_slurm_job_of_two_nodes(api: Any, job_id: int, job: dict[str, Any], steps: int) -> None:
    [attempt] = job["attempts"]
    # Every attempt has node rows; a scheduled job's are all the executor's (no gang of hosts formed).
    assert [(n["node_rank"], n["worker_name"]) for n in attempt["nodes"]] == [
        (0, "slurm-test"),
        (1, "slurm-test"),
    ]
    plan = attempt["plan"]
    argv = plan["argv"]
    assert argv[argv.index("--nnodes") + 1] == "2" and "--node-rank" not in argv
    events = slurm_events(api, job_id)
    assert len({e["data"]["slurm_job_id"] for e in events}) == 1, events
    running = [e for e in events if e["data"].get("state") == "RUNNING"]
    assert running and running[0]["data"]["nodes"] == "n[1-2]", events
    # Each node filled the plan's open variables from the allocation: its own rank and address, node 0's
    # address (n1's NodeAddr), the interface holding its address, the port found free on node 0.
    node0, node1 = _launched(plan["run_dir"]), _launched(plan["run_dir"] + "-node-1")
    assert [node0["PET_NODE_RANK"], node1["PET_NODE_RANK"]] == ["0", "1"]
    assert node0["MASTER_ADDR"] == node1["MASTER_ADDR"] == NODES["n1"]
    assert [node0["PET_LOCAL_ADDR"], node1["PET_LOCAL_ADDR"]] == [NODES["n1"], NODES["n2"]]
    assert node0["GLOO_SOCKET_IFNAME"] == node1["GLOO_SOCKET_IFNAME"] == "eth0"
    assert node0["MASTER_PORT"] == node1["MASTER_PORT"] and node0["MASTER_PORT"].isdigit()
    started = [e for e in api.get(f"/jobs/{job_id}/events").json()["events"] if "world_size" in e["data"]]
    assert [e["data"]["world_size"] for e in started] == [4], started
    assert _steps(api, job_id) == list(range(1, steps + 1))  # global rank 0's, once per step
    # Each node's log reached the service as that node's, byte for byte as its run directory has it.
    for node, run_dir in ((0, plan["run_dir"]), (1, plan["run_dir"] + "-node-1")):
        shipped = api.get(f"/jobs/{job_id}/logs", params={"node": node, "max_bytes": 8 * 2**20}).json()[
            "text"
        ]
        assert shipped == (Path(run_dir) / "output.log").read_bytes().decode(errors="replace"), node


def test_a_two_node_lora_recipe_runs_as_one_slurm_job_with_world_size_4(on_slurm: Any) -> None:
    service, worker = on_slurm()
    api = service.api()
    job_id = _submit(api, _two_nodes(tiny_recipe(max_steps=4, name="slurm-2n")))
    job = _wait_status(api, job_id, _DONE, 240)
    assert job["status"] == "succeeded", (job, worker.log()[-3000:])
    _check_one_slurm_job_of_two_nodes(api, job_id, job, 4)


def test_a_two_node_script_job_runs_as_one_slurm_job_with_world_size_4(on_slurm: Any) -> None:
    service, worker = on_slurm()
    api = service.api()
    recipe = json.loads((EXAMPLES / "own-script" / "plain-loop-job.json").read_text())
    recipe["entrypoint"]["args"][-1] = "6"  # --max-steps
    job_id = _submit(api, _two_nodes(recipe))
    job = _wait_status(api, job_id, _DONE, 240)
    assert job["status"] == "succeeded", (job, worker.log()[-3000:])
    _check_one_slurm_job_of_two_nodes(api, job_id, job, 6)


def test_nodes_with_no_route_to_the_service_run_a_two_node_recipe_the_worker_carrying_their_files(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    """`--slurm-relay`: the service listens on the host's loopback, which no node reaches; the runners
    write events and their finish into their run directories and the worker, on the host, carries
    them and both nodes' logs and metrics while the job runs (worker/agent/outbox.py)."""
    service, worker = on_slurm(worker_options=("--slurm-relay",), nodes_reach_service=False)
    api = service.api()
    port = service.url.rsplit(":", 1)[1]
    probe = subprocess.run(
        [
            "srun",
            "-N1",
            "-w",
            "n1",
            sys.executable,
            "-c",
            f"import socket; socket.create_connection(('127.0.0.1', {port}), 3)",
        ],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode != 0 and "ConnectionRefusedError" in probe.stderr, (
        probe
    )  # unreachable from a node
    job_id = _submit(api, _two_nodes(tiny_recipe(max_steps=60, name="slurm-relay")))
    _wait_training(api, job_id, 1)
    steps_then = _steps(api, job_id)
    live = api.get(f"/jobs/{job_id}").json()
    # Carried while the job runs, not only at its end (the stall watch needs them live).
    assert live["status"] == "running" and len(steps_then) < 60, (live["status"], steps_then)
    job = _wait_status(api, job_id, _DONE, 240)
    assert job["status"] == "succeeded", (job, worker.log()[-3000:])
    _check_one_slurm_job_of_two_nodes(api, job_id, job, 60)
    # Each node's host check and launch events came through its outbox (node 1's named as its own).
    messages = [e["message"] for e in api.get(f"/jobs/{job_id}/events").json()["events"]]
    for node in ("", "node 1: "):
        assert any(m.startswith(f"{node}MASTER_PORT ") for m in messages), (node, messages)
    run_dir = Path(job["attempts"][0]["plan"]["run_dir"])
    assert (run_dir / "finish-report.json").is_file() and (run_dir / "outbox-events.jsonl").is_file()
    # The worker's token never went to the nodes: the job's environment, as slurmctld keeps it, has none.
    slurm_job = int(slurm_events(api, job_id)[0]["data"]["slurm_job_id"])
    environment = slurm_cluster.root / "state" / f"hash.{slurm_job % 10}" / f"job.{slurm_job}" / "environment"
    assert (
        b"SLURM_NTASKS=" in environment.read_bytes()
        and b"FLIGHTDECK_WORKER_TOKEN" not in environment.read_bytes()
    )
