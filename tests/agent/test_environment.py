"""Launch environment: inherited launcher variables scrubbed (P005), the attempt's one port (E002)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from flightdeck.inventory import WorkerInventory
from flightdeck.launch import build_launch_plan
from flightdeck.recipe import parse_recipe
from flightdeck.worker.agent import environment as agent_environment
from flightdeck.worker.agent.environment import launch_environment
from flightdeck.worker.agent.host_check import run_host_check
from flightdeck.worker.host_preflight import environment as host_environment
from flightdeck.worker.host_preflight.ports import find_free_port, resolve_master_port

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
    "FLIGHTDECK_TOKEN": "user-secret",
    "FLIGHTDECK_ADMIN_TOKEN_FILE": "/etc/admin-token",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "1",
    "FLIGHTDECK_SERVICE_URL": "http://service:8000",
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
    return build_launch_plan(recipe, inventory, job_id=1, database="db", attempt_number=1, devices=None)


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
    for credential in ("FLIGHTDECK_WORKER_TOKEN", "FLIGHTDECK_TOKEN", "FLIGHTDECK_ADMIN_TOKEN_FILE"):
        assert credential not in env  # the CLI's user token too: the trainer holds no credential
    assert "GROUP_WORLD_SIZE" not in env and "ROLE_RANK" not in env
    assert env["FLIGHTDECK_SERVICE_URL"] == "http://service:8000"  # not a credential: kept
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/u"
    assert env["OMP_NUM_THREADS"] == "1"  # the plan's value, not the inherited one
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "31234"
    assert "RANK" in resolved["scrubbed"].split(",")


def test_an_open_port_is_filled_only_with_the_attempts_resolved_one() -> None:
    # The environment never picks a port of its own: the one resolved port fills both variables.
    with pytest.raises(ValueError, match="resolved once"):
        launch_environment(_plan(), {})
    env, resolved = launch_environment(_plan(), {}, port=31235)
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == resolved["port"] == "31235"


def test_the_resolved_port_wins_over_the_recipes_pinned_one() -> None:
    # Node 1 of a gang whose recipe pins a port starts on node 0's port, in both variables at once.
    env, _ = launch_environment(_plan({"MASTER_PORT": "29613"}), INHERITED, port=29999)
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29999"


def test_a_free_pinned_port_is_the_resolved_one() -> None:
    pinned = find_free_port()
    resolved = resolve_master_port(str(pinned))
    assert (resolved.port, resolved.code) == (pinned, None)
    assert "the recipe's MASTER_PORT" in resolved.reason


def test_without_a_pinned_port_the_kernel_picks_a_free_one() -> None:
    resolved = resolve_master_port(None)
    assert resolved.code is None and "free" in resolved.reason
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", resolved.port))  # free: binding succeeds


def test_free_port_differs_from_a_listening_one() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert find_free_port() != sock.getsockname()[1]


def test_one_launcher_variable_list_for_scrubbing_and_reporting() -> None:
    # Host preflight reports (P005) exactly what the agent scrubs, from the one list.
    assert not hasattr(agent_environment, "SCRUBBED_EXACT")
    assert not hasattr(agent_environment, "free_port")
    for name in ("GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "PET_NNODES", "TORCHELASTIC_RUN_ID"):
        assert host_environment.is_launcher_variable(name)
        assert agent_environment.is_scrubbed(name)
    [p005] = host_environment.inherited_launcher_env({"PET_NNODES": "2", "PATH": "/usr/bin"})
    assert "PET_NNODES=2" in p005.finding.message


def test_a_busy_pinned_master_port_is_reported_by_host_preflight_and_replaced_by_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # E002: host preflight reports the busy port and picks nothing; the one resolution replaces it.
    monkeypatch.setattr("flightdeck.worker.agent.host_check.run_host_preflight", _preflight_without_files)
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        pinned = str(busy.getsockname()[1])
        recipe = _recipe({"MASTER_PORT": pinned})
        inventory = WorkerInventory(
            cpu_slots=2, cores=2, workspace=str(tmp_path), runs_dir=str(tmp_path / "runs")
        )
        plan = build_launch_plan(
            parse_recipe(recipe), inventory, job_id=1, database="db", attempt_number=1, devices=None
        )
        check = run_host_check(recipe, inventory, plan.devices, run_dir=plan.run_dir)
        port = resolve_master_port(plan.env_value("MASTER_PORT"))
        env, _ = launch_environment(plan, {}, port=port.port)
    [e002] = check.findings
    assert e002["code"] == "E002" and e002["value"] is None
    assert (check.effective or {})["env"]["MASTER_PORT"] == pinned
    assert port.code == "E002" and pinned in port.reason
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == str(port.port) != pinned
    with socket.socket() as sock:
        sock.bind(("", port.port))  # free


def _recipe(env: dict[str, str]) -> dict[str, object]:
    return {
        "name": "env-test",
        "model": {"path": "m"},
        "data": {"train": [{"path": "d.jsonl"}]},
        "resources": {"gpus_per_node": 2, "accelerator": "cpu"},
        "env": env,
    }


def _preflight_without_files(recipe, inventory, workspace, devices):  # type: ignore[no-untyped-def]
    """The real host rules on env and ports only (no model or data on disk in this test)."""
    from flightdeck.preflight.engine import check_stages, run_rules

    result = check_stages(recipe, lambda _, stage: run_rules(stage, [host_environment.master_port_in_use]))
    return result
