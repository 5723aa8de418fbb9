"""The plan's environment, one producer per concern (flightdeck/launch/environment.py), and their
composition: every variable once, each with its reason, the recipe's values laid over in one place."""

from __future__ import annotations

from typing import Any

from flightdeck.inventory import GpuInfo, WorkerInventory
from flightdeck.launch import EnvVar, build_launch_plan
from flightdeck.launch.environment import (
    collective_variables,
    device_variables,
    plan_environment,
    rendezvous_variables,
    run_file_variables,
    thread_variables,
)
from flightdeck.preflight.engine import run_static_preflight
from flightdeck.recipe import parse_recipe
from flightdeck.recipe.schema import Recipe
from flightdeck.run_variables import RESUME_VARIABLE


def _recipe(**overrides: Any) -> Recipe:
    payload: dict[str, Any] = {
        "name": "concerns",
        "model": {"path": "models/tiny"},
        "data": {"train": [{"path": "data/train.jsonl"}]},
    }
    return parse_recipe(payload | overrides)


def _gpus(count: int, name: str = "NVIDIA A100-SXM4-40GB", **facts: Any) -> WorkerInventory:
    gpus = [GpuInfo(index=i, name=name, memory_mb=40960, compute_capability="8.0") for i in range(count)]
    return WorkerInventory(gpus=gpus, cores=16, workspace="/ws", runs_dir="/ws/runs", **facts)


def _values(env: list[EnvVar]) -> dict[str, str | None]:
    return {var.name: var.value for var in env}


def test_devices_name_the_attempts_gpus_in_bus_order_or_hide_them_on_a_cpu_worker() -> None:
    on_gpus = _values(device_variables(_recipe(), _gpus(4), [2, 3]))
    assert on_gpus == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "SHIRG_NO_DEVICE_MAP": "1",
    }
    cpu = WorkerInventory(cpu_slots=2, cores=2, workspace="/ws")
    mapped = _recipe(model={"path": "m", "device_map": "auto"}, resources={"accelerator": "cpu"})
    # No GPU for the ranks, and the HF Trainer told so (accelerate would leave each rank out of the group).
    assert _values(device_variables(mapped, cpu, [0])) == {
        "CUDA_VISIBLE_DEVICES": "",
        "ACCELERATE_USE_CPU": "true",
    }


def test_threads_are_cores_per_process_and_an_oversubscribing_recipe_value_is_corrected_e003() -> None:
    recipe = _recipe(resources={"gpus_per_node": 4})
    [omp] = thread_variables(recipe, _gpus(4))
    assert (omp.name, omp.value, omp.code) == ("OMP_NUM_THREADS", "4", None)
    [omp] = thread_variables(_recipe(resources={"gpus_per_node": 4}, env={"OMP_NUM_THREADS": "8"}), _gpus(4))
    assert (omp.value, omp.code) == ("4", "E003") and "the recipe's 8 replaced" in omp.reason


def test_tokenizer_threads_are_decided_once_at_submit_e004() -> None:
    # The plan sets no TOKENIZERS_PARALLELISM of its own: the static fix writes it into the recipe.
    bare = _recipe()
    assert "TOKENIZERS_PARALLELISM" not in _values(thread_variables(bare, _gpus(1)))
    effective = run_static_preflight(bare).effective
    plan = build_launch_plan(effective, _gpus(1), job_id=1, database="db", attempt_number=1, devices=[0])
    [var] = [v for v in plan.env if v.name == "TOKENIZERS_PARALLELISM"]
    assert var.value == "false" and "E004" in var.reason


def test_collectives_turn_off_nccl_peer_to_peer_on_consumer_gpus_and_record_their_last_calls() -> None:
    recipe = _recipe(resources={"gpus_per_node": 2}, env={"NCCL_IB_DISABLE": "0"})
    env = collective_variables(recipe, _gpus(2, "NVIDIA GeForce RTX 4090"), [0, 1], "nccl", "/ws/runs/r")
    codes = {var.name: var.code for var in env}
    # The recipe's own NCCL_IB_DISABLE is no correction (no code): the composition keeps its value.
    assert codes["NCCL_P2P_DISABLE"] == "E005" and codes["NCCL_IB_DISABLE"] is None
    assert _values(env)["TORCH_FR_DUMP_TEMP_FILE"] == "/ws/runs/r/nccl_trace_rank_"
    one = collective_variables(_recipe(), _gpus(1), [0], "nccl", "/r")
    assert _values(one) == {"FLIGHTDECK_BACKEND": "nccl"}


def test_rendezvous_leaves_the_port_to_the_host_and_names_node_zero() -> None:
    single = _values(rendezvous_variables(_recipe(), None, scheduled=False))
    assert single == {"MASTER_PORT": None, "PET_MASTER_PORT": None}
    gang = _values(rendezvous_variables(_recipe(resources={"nodes": 2}), "10.0.0.5", scheduled=False))
    assert gang["MASTER_ADDR"] == "10.0.0.5"
    scheduled = rendezvous_variables(_recipe(resources={"nodes": 2}), None, scheduled=True)
    assert {v.name for v in scheduled if v.value is None} >= {
        "MASTER_ADDR",
        "PET_NODE_RANK",
        "GLOO_SOCKET_IFNAME",
    }


def test_run_files_point_the_ranks_at_the_run_directory_and_a_retry_at_its_checkpoint() -> None:
    first = _values(run_file_variables(_recipe(), _gpus(1), "/ws/runs/r", attempt_number=1))
    assert first["FLIGHTDECK_RUN_DIR"] == "/ws/runs/r" and first["FLIGHTDECK_WORKSPACE"] == "/ws"
    assert RESUME_VARIABLE not in first
    retry = _values(run_file_variables(_recipe(), _gpus(1), "/ws/runs/r", attempt_number=2))
    assert retry[RESUME_VARIABLE] is None  # found by the runner on the host


def test_the_composition_lays_the_recipe_over_every_concern_once_with_a_reason_each() -> None:
    recipe = _recipe(
        resources={"gpus_per_node": 2},
        env={
            "OMP_NUM_THREADS": "64",
            "SHIRG_NO_DEVICE_MAP": "0",
            "MASTER_PORT": "29612",
            "MKL_NUM_THREADS": "2",
        },
    )
    env = plan_environment(
        recipe,
        _gpus(2),
        [0, 1],
        backend="nccl",
        run_dir="/ws/runs/r",
        attempt_number=1,
        master_addr=None,
        scheduled=False,
    )
    names = [v.name for v in env]
    assert len(names) == len(set(names)) and all(v.reason for v in env)
    by_name = {v.name: v for v in env}
    assert (by_name["OMP_NUM_THREADS"].value, by_name["OMP_NUM_THREADS"].code) == ("8", "E003")  # corrected
    assert by_name["SHIRG_NO_DEVICE_MAP"].value == "0"  # the recipe's, saying so
    assert by_name["SHIRG_NO_DEVICE_MAP"].reason.startswith("set by the recipe (")
    assert by_name["MASTER_PORT"].value == by_name["PET_MASTER_PORT"].value == "29612"
    assert (by_name["MKL_NUM_THREADS"].value, by_name["MKL_NUM_THREADS"].reason) == ("2", "set by the recipe")
