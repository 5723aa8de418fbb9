"""Launch environment: inherited launcher variables scrubbed (P005), a free port resolved (E002)."""

from __future__ import annotations

import socket

from service.inventory import WorkerInventory
from service.launch import build_launch_plan
from service.recipe import parse_recipe
from worker.agent.environment import free_port, launch_environment

INHERITED = {
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "MASTER_ADDR": "10.9.9.9",
    "MASTER_PORT": "29500",
    "RANK": "3",
    "WORLD_SIZE": "16",
    "LOCAL_RANK": "3",
    "PET_NPROC_PER_NODE": "8",
    "TORCHELASTIC_RUN_ID": "old",
    "FLIGHTDECK_WORKER_TOKEN": "secret",
    "OMP_NUM_THREADS": "64",
}


def _plan(env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    recipe = parse_recipe(
        {
            "name": "env-test",
            "model": {"path": "m"},
            "data": {"train": [{"path": "d.jsonl"}]},
            "resources": {"gpus_per_node": 2, "accelerator": "cpu"},
            "env": env or {},
        }
    )
    inventory = WorkerInventory(cpu_slots=2, cores=2, workspace="/ws", runs_dir="/ws/runs")
    return build_launch_plan(recipe, inventory, job_id=1, attempt_number=1, devices=None)


def test_inherited_launcher_variables_and_credentials_are_scrubbed() -> None:
    env, resolved = launch_environment(_plan(), INHERITED, port=31234)
    for name in (
        "MASTER_ADDR",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "PET_NPROC_PER_NODE",
        "TORCHELASTIC_RUN_ID",
    ):
        assert name not in env
    assert "FLIGHTDECK_WORKER_TOKEN" not in env
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/u"
    assert env["OMP_NUM_THREADS"] == "1"  # the plan's value, not the inherited one
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "31234"
    assert "RANK" in resolved["scrubbed"].split(",")


def test_free_port_is_picked_when_the_plan_leaves_it_open() -> None:
    env, resolved = launch_environment(_plan(), {})
    port = int(env["MASTER_PORT"])
    assert resolved["port"] == str(port) == env["PET_MASTER_PORT"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free: binding succeeds


def test_recipe_port_is_kept() -> None:
    env, resolved = launch_environment(_plan({"MASTER_PORT": "29613"}), INHERITED)
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29613"
    assert "port" not in resolved


def test_free_port_differs_from_a_listening_one() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert free_port() != sock.getsockname()[1]
