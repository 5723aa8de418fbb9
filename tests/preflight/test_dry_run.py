"""POST /preflight's dry run: inventory host rules on a described worker and the memory estimate."""

from __future__ import annotations

from typing import Any

from flightdeck.inventory import WorkerInventory
from flightdeck.preflight import preflight_for_host

from .factories import LLAMA2_7B, inventory, make_recipe

# Llama-2-7B LoRA q,v r=8 bf16, batch 1 x 1304 tokens, no checkpointing: ~21 GB estimated.
SEVEN_B = {
    "model": {"gradient_checkpointing": False},
    "adapter": {"r": 8},
    "data": {"max_seq_length": 1304},
    "training": {"per_device_batch_size": 1},
}


def _codes(
    recipe: Any, host: WorkerInventory | None, config: dict[str, Any] | None = LLAMA2_7B
) -> dict[str, str]:
    return {f.code or "": f.severity for f in preflight_for_host(recipe, host, config).findings}


def test_m001_names_the_cheapest_change_and_m002_warns_near_the_limit() -> None:
    recipe = make_recipe(SEVEN_B)
    result = preflight_for_host(recipe, inventory(1, memory_mb=16 * 1024), LLAMA2_7B)
    m001 = [f for f in result.findings if f.code == "M001"]
    assert m001 and m001[0].severity == "error" and "gradient checkpointing" in m001[0].message
    assert "weights 13.48 GB" in m001[0].message
    assert not result.ok
    assert _codes(recipe, inventory(1, memory_mb=21 * 1024)).get("M002") == "warn"
    assert not {"M001", "M002"} & set(_codes(recipe, inventory(1, memory_mb=40 * 1024)))


def test_gpu_rules_on_a_described_host() -> None:
    t4 = inventory(2, name="Tesla T4", memory_mb=15360, cc="7.5")
    flash = make_recipe(model={"attn_implementation": "flash_attention_2"}, resources={"gpus_per_node": 2})
    codes = _codes(flash, t4, None)
    assert codes["X001"] == "error" and codes["X004"] == "fix"
    assert not {"X001", "X004"} & set(_codes(flash, inventory(2), None))
    assert _codes(make_recipe(resources={"gpus_per_node": 4}), inventory(2), None)["P004"] == "error"
    assert _codes(make_recipe(), WorkerInventory(gpus=[], cpu_slots=2), None)["P004"] == "error"
    cpu = make_recipe(resources={"accelerator": "cpu"})
    assert "P004" not in _codes(cpu, WorkerInventory(gpus=[], cpu_slots=2), None)


def test_x004_fix_lands_in_the_effective_recipe() -> None:
    recipe = make_recipe(model={"attn_implementation": "flash_attention_2"})
    result = preflight_for_host(recipe, inventory(1, name="Tesla V100", cc="7.0"), None)
    assert result.effective.model.attn_implementation == "sdpa"


def _plan_env(result: Any) -> dict[str, str | None]:
    return {var.name: var.value for var in result.plan.env}


def test_e003_threads_times_processes_beyond_cores_are_the_plans_decision() -> None:
    recipe = make_recipe(env={"OMP_NUM_THREADS": "8"}, resources={"gpus_per_node": 4})
    result = preflight_for_host(recipe, inventory(4, cores=16), None)
    assert [(f.code, f.value, f.path) for f in result.findings if f.code == "E003"] == [
        ("E003", "4", "env.OMP_NUM_THREADS")
    ]
    assert _plan_env(result)["OMP_NUM_THREADS"] == "4"  # the launch runs with it
    assert result.effective.env["OMP_NUM_THREADS"] == "8"  # the recipe is the user's, unchanged
    assert "E003" not in _codes(recipe, inventory(4, cores=32), None)


def test_e005_consumer_gpus_get_p2p_disabled_by_the_plan() -> None:
    recipe = make_recipe(resources={"gpus_per_node": 2})
    rtx = inventory(2, name="NVIDIA GeForce RTX 4090", memory_mb=24564, cc="8.9")
    result = preflight_for_host(recipe, rtx, None)
    env = _plan_env(result)
    assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_IB_DISABLE"] == "1"
    assert {f.code for f in result.findings if f.path.startswith("env.NCCL")} == {"E005"}
    assert "E005" not in _codes(recipe, inventory(2), None)
    # One definition of a consumer card: a GeForce 2080 and a TITAN count, as the old host rule said.
    for name in ("NVIDIA GeForce RTX 2080 Ti", "NVIDIA TITAN RTX"):
        assert "E005" in _codes(recipe, inventory(2, name=name, cc="7.5"), None), name
    assert "E005" not in _codes(make_recipe(), inventory(1, name="NVIDIA GeForce RTX 4090", cc="8.9"), None)
    p2p_ok = rtx.model_copy(update={"nccl_p2p_ok": True})
    assert "E005" not in _codes(recipe, p2p_ok, None)


def test_memory_is_a_breakdown_or_says_why_unknown() -> None:
    recipe = make_recipe(SEVEN_B)
    memory = preflight_for_host(recipe, None, LLAMA2_7B).memory
    assert isinstance(memory, list) and memory[0]["total_gb"] > memory[0]["weights_gb"] > 13
    assert set(memory[0]) >= {"adapter_gb", "gradients_gb", "optimizer_gb", "activations_gb", "overhead_gb"}
    assert "unknown" in str(preflight_for_host(recipe, None, None).memory)
    assert "mamba" in str(preflight_for_host(recipe, None, {"model_type": "mamba"}).memory)
