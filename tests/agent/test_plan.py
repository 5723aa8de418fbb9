"""Launch plan: argv and environment for GPU, multi-GPU, device-mapped and CPU workers."""

from __future__ import annotations

import pytest

from flightdeck.inventory import GpuInfo, WorkerInventory
from flightdeck.launch import LaunchPlan, PlanError, build_launch_plan
from flightdeck.recipe import parse_recipe


def _recipe(**overrides: object) -> object:
    payload: dict[str, object] = {
        "name": "plan-test",
        "model": {"path": "models/tiny"},
        "data": {"train": [{"path": "data/train.jsonl"}]},
    }
    payload.update(overrides)
    return parse_recipe(payload)


def _gpus(count: int, name: str = "NVIDIA A100-SXM4-40GB") -> WorkerInventory:
    gpus = [GpuInfo(index=i, name=name, memory_mb=40960, compute_capability="8.0") for i in range(count)]
    return WorkerInventory(gpus=gpus, cores=64, workspace="/ws", runs_dir="/ws/runs")


def _env(plan: LaunchPlan) -> dict[str, str | None]:
    return {var.name: var.value for var in plan.env}


def test_one_gpu() -> None:
    plan = build_launch_plan(_recipe(), _gpus(1), job_id="j1", database="db", attempt_number=1, devices=[0])
    assert plan.argv[:3] == ["python", "-m", "torch.distributed.run"]
    assert plan.argv[plan.argv.index("--nproc_per_node") + 1] == "1"
    assert plan.argv[plan.argv.index("--nnodes") + 1] == "1"
    assert plan.argv[-3:] == ["-m", "flightdeck.worker.train", "/ws/runs/db/job-j1-attempt-1/recipe.json"]
    assert plan.run_dir == "/ws/runs/db/job-j1-attempt-1"
    env = _env(plan)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    # nvidia-smi (the inventory) numbers GPUs in PCI bus order; CUDA must too.
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["OMP_NUM_THREADS"] == "64"
    # E004 is decided once, at submit (the static fix writes it into the recipe); this recipe skipped it.
    assert "TOKENIZERS_PARALLELISM" not in env
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["FLIGHTDECK_BACKEND"] == "nccl"
    assert env["FLIGHTDECK_WORKSPACE"] == "/ws"
    assert env["MASTER_PORT"] is None and env["PET_MASTER_PORT"] is None
    assert plan.backend == "nccl" and plan.devices == [0]
    assert all(var.reason for var in plan.env)


def test_eight_gpus_replicated_under_ddp() -> None:
    recipe = _recipe(resources={"gpus_per_node": 8}, env={"OMP_NUM_THREADS": "4"})
    plan = build_launch_plan(
        recipe, _gpus(8), job_id=7, database="db", attempt_number=2, devices=list(range(8))
    )
    assert plan.nproc_per_node == 8
    assert plan.argv[plan.argv.index("--nproc_per_node") + 1] == "8"
    env = _env(plan)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert env["OMP_NUM_THREADS"] == "4"  # the recipe's value wins over cores / processes
    assert "set by the recipe" in next(v.reason for v in plan.env if v.name == "OMP_NUM_THREADS")
    assert env["SHIRG_NO_DEVICE_MAP"] == "1"
    assert "NCCL_P2P_DISABLE" not in env  # data-centre cards keep peer-to-peer


def test_consumer_gpus_get_nccl_fixes_and_recipe_values_are_kept() -> None:
    plan = build_launch_plan(
        _recipe(resources={"gpus_per_node": 2}, env={"NCCL_IB_DISABLE": "0"}),
        _gpus(4, "NVIDIA GeForce RTX 4090"),
        job_id="j",
        database="db",
        attempt_number=1,
        devices=[2, 3],
    )
    env = _env(plan)
    assert env["NCCL_P2P_DISABLE"] == "1"
    assert env["NCCL_IB_DISABLE"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["OMP_NUM_THREADS"] == "32"


def test_device_mapped_model_is_one_process_over_all_its_gpus() -> None:
    recipe = _recipe(model={"path": "m", "device_map": "balanced"}, resources={"gpus_per_node": 2})
    plan = build_launch_plan(recipe, _gpus(2), job_id="j", database="db", attempt_number=1, devices=None)
    assert plan.nproc_per_node == 1
    assert plan.argv[plan.argv.index("--nproc_per_node") + 1] == "1"
    env = _env(plan)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "SHIRG_NO_DEVICE_MAP" not in env


def test_cpu_mode_uses_gloo_and_slots() -> None:
    inventory = WorkerInventory(cpu_slots=2, cores=2, workspace="/ws", runs_dir="/runs")
    recipe = _recipe(resources={"gpus_per_node": 2, "accelerator": "cpu"})
    plan = build_launch_plan(recipe, inventory, job_id="j", database="db", attempt_number=1, devices=[0, 1])
    env = _env(plan)
    assert plan.backend == "gloo" and env["FLIGHTDECK_BACKEND"] == "gloo"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU worker on a GPU host leaves the GPUs alone
    assert env["OMP_NUM_THREADS"] == "1"
    assert plan.nproc_per_node == 2 and plan.devices == [0, 1]


def test_too_few_devices_is_refused() -> None:
    with pytest.raises(PlanError, match="P004"):
        build_launch_plan(
            _recipe(resources={"gpus_per_node": 4}),
            _gpus(2),
            job_id="j",
            database="db",
            attempt_number=1,
            devices=None,
        )


def test_recipe_master_port_is_kept_for_both_variables() -> None:
    plan = build_launch_plan(
        _recipe(env={"MASTER_PORT": "29612"}),
        _gpus(1),
        job_id="j",
        database="db",
        attempt_number=1,
        devices=[0],
    )
    env = _env(plan)
    assert env["MASTER_PORT"] == "29612" and env["PET_MASTER_PORT"] == "29612"


@pytest.mark.parametrize("rank", [0, 1])
def test_each_node_of_a_multi_node_job_meets_at_node_zero_with_its_own_rank(rank: int) -> None:
    # Static rendezvous: c10d would ignore --node-rank and take the master address from the FQDN.
    plan = build_launch_plan(
        _recipe(resources={"nodes": 2, "gpus_per_node": 8}),
        _gpus(8).model_copy(update={"address": f"10.0.0.{5 + rank}"}),
        job_id="j",
        database="db",
        attempt_number=1,
        devices=None,
        node_rank=rank,
        master_addr="10.0.0.5",
    )
    argv = plan.argv
    assert plan.nnodes == 2
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--nproc_per_node") + 1] == "8"
    assert argv[argv.index("--rdzv-backend") + 1] == "static"
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.5"
    assert argv[argv.index("--node-rank") + 1] == str(rank)
    assert argv[argv.index("--rdzv-conf") + 1] == "timeout=120"  # not torchrun's 600 s (N001)
    env = _env(plan)
    assert env["MASTER_ADDR"] == "10.0.0.5"
    # The port is node 0's to pick on its host and report; the agent fills both variables with it.
    assert env["MASTER_PORT"] is None and env["PET_MASTER_PORT"] is None
    assert all(var.reason for var in plan.env)
    # Agents of one host may share a runs directory: each node writes its own run directory.
    assert plan.run_dir == (
        "/ws/runs/db/job-j-attempt-1" if rank == 0 else "/ws/runs/db/job-j-attempt-1-node-1"
    )


def test_a_multi_node_plan_without_node_zeros_address_is_refused() -> None:
    with pytest.raises(PlanError, match="node 0's address"):
        build_launch_plan(
            _recipe(resources={"nodes": 2, "gpus_per_node": 1}),
            _gpus(1),
            job_id="j",
            database="db",
            attempt_number=1,
            devices=None,
        )


def test_nothing_from_the_recipe_reaches_the_argv() -> None:
    hostile = "x'; $(touch /tmp/pwned) `id` \n rm -rf / \""
    recipe = _recipe(name=hostile, model={"path": hostile}, data={"train": [{"path": hostile}]})
    plan = build_launch_plan(
        recipe, _gpus(1), job_id="job'$(id)", database="db", attempt_number=1, devices=[0]
    )
    # The same job with a plain name and paths gets the very same argv: the recipe's text is not in it.
    benign = _recipe(name="plain", model={"path": "models/m"}, data={"train": [{"path": "data/d.jsonl"}]})
    assert (
        plan.argv
        == build_launch_plan(
            benign, _gpus(1), job_id="job'$(id)", database="db", attempt_number=1, devices=[0]
        ).argv
    )
    assert not any(hostile in arg or "$(" in arg or "'" in arg for arg in plan.argv)
    assert plan.run_dir == "/ws/runs/db/job-job___id_-attempt-1"


@pytest.mark.parametrize("database", ["", "..", "a/b", ".hidden"])
def test_a_database_id_that_is_no_folder_name_is_refused_not_joined(database: str) -> None:
    with pytest.raises(ValueError, match="is not a folder name"):
        build_launch_plan(_recipe(), _gpus(1), job_id=1, database=database, attempt_number=1, devices=[0])
