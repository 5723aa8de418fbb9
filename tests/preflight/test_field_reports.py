"""The four field-report set-ups (docs/failures.md): the failing configuration is refused or fixed with the right code,
the corrected one passes (no errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flightdeck.memory.reference_models import QWEN25_7B
from flightdeck.preflight import preflight_for_host, run_static_preflight
from flightdeck.recipe.findings import Finding
from flightdeck.worker.host_preflight import run_host_preflight

from .factories import BASE, inventory, make_recipe

A100_8 = inventory(8, name="NVIDIA A100-SXM4-40GB", memory_mb=40960, cc="8.0")


def _by_code(findings: list[Finding]) -> dict[str, str]:
    return {f.code or "": f.severity for f in findings}


def _errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


# R1 in miniature: 8 GPUs DDP, LoRA, bf16, checkpointing, ChartQA read without its field map.
R1_FAILING: dict[str, Any] = {
    "model": {"freeze": ["self_attn"], "gradient_checkpointing_reentrant": True},
    "data": {
        "train": [{"path": "data/chartqa_flat.jsonl"}],
        "eval": [{"path": "data/chartqa", "preset": "chartqa", "split": "validation"}],
        "num_workers": 2,
    },
    "training": {"per_device_batch_size": 2, "gradient_accumulation_steps": 2},
    "resources": {"gpus_per_node": 8},
}
R1_FIXED: dict[str, Any] = {
    "model": {"freeze": ["embed_tokens"]},
    "data": {
        "train": [{"path": "data/chartqa_flat.jsonl", "preset": "chartqa"}],
        "eval": [{"path": "data/chartqa", "preset": "chartqa", "split": "val"}],
        "num_workers": 2,
    },
    "training": {"per_device_batch_size": 2, "gradient_accumulation_steps": 2},
    "resources": {"gpus_per_node": 8},
    "env": {"SHIRG_NO_DEVICE_MAP": "1", "OMP_NUM_THREADS": "4"},
}


def _r1(workspace: Path, layer: dict[str, Any]) -> list[Finding]:
    static = run_static_preflight(make_recipe(layer))
    return static.findings + run_host_preflight(static.effective, A100_8, workspace, [], environ={}).findings


def test_r1_failing_is_refused_with_every_cause(workspace: Path) -> None:
    codes = _by_code(_r1(workspace, R1_FAILING))
    assert codes["D001"] == "error" and codes["D003"] == "error"
    assert codes["G001"] == "fix" and codes["G004"] == "fix" and codes["E001"] == "fix"


def test_r1_corrected_passes(workspace: Path) -> None:
    findings = _r1(workspace, R1_FIXED)
    assert _errors(findings) == []
    assert "G001" not in _by_code(findings)


# R2 stage 2: 4-bit LoRA on the stage-1 checkpoint, device_map 'balanced' over 2 GPUs in one process.
def _r2(stage2_model: dict[str, Any]) -> list[Finding]:
    recipe = make_recipe(
        resources={"gpus_per_node": 2},
        stages=[
            {"adapter": None, "model": {"freeze": ["layers"]}},
            {"model": {"path": "@previous", "quantization": "4bit", **stage2_model}},
        ],
    )
    return run_static_preflight(recipe).findings


def test_r2_device_mapped_stage_is_fixed_against_data_parallel() -> None:
    findings = _r2({"device_map": "balanced"})
    assert ("P002", "fix", "stages[1].model.device_map") in {(f.code, f.severity, f.path) for f in findings}
    assert _errors(findings) == []


def test_r2_corrected_ddp_stage_passes_with_per_rank_placement() -> None:
    findings = _r2({"device_map": None})
    assert "P002" not in _by_code(findings)
    assert _by_code(findings)["P006"] == "fix"
    assert _errors(findings) == []


# R3: masked-LM pre-training on 8 GPUs with an in-memory corpus.
def test_r3_lazy_loading_passes_without_a_static_label() -> None:
    recipe = make_recipe(
        task="masked_lm",
        adapter=None,
        data={"train": [{"path": "data/corpus.txt", "preset": "text"}], "num_workers": 4},
        training={"per_device_batch_size": 32},
        resources={"gpus_per_node": 8},
    )
    findings = run_static_preflight(recipe).findings
    # Datasets always pickle lazily; D004 is a run-time detection (a worker finding other samples),
    # not a note on every multi-process recipe.
    assert "D004" not in {f.code for f in findings}
    assert _errors(findings) == []


# R4: Qwen2.5-7B LoRA r=128 fp16 on one 24 GB GPU.
RTX_24GB = inventory(1, name="NVIDIA GeForce RTX 4090", memory_mb=24564, cc="8.9")
R4 = {
    "model": {"dtype": "float16"},
    "adapter": {"r": 128, "target_modules": "all-linear"},
    "training": {"precision": "fp16", "per_device_batch_size": 4, "gradient_accumulation_steps": 4},
    "data": {"max_seq_length": 2048},
}


def test_r4_oom_is_refused_with_the_cheapest_change() -> None:
    result = preflight_for_host(make_recipe(R4), RTX_24GB, QWEN25_7B)
    m001 = [f for f in result.findings if f.code == "M001"]
    assert m001 and m001[0].severity == "error" and "cheapest change that fits" in m001[0].message


def test_r4_offload_is_refused() -> None:
    offload = make_recipe(R4, model={"device_map": "auto", "max_memory": {"0": "22GiB", "cpu": "64GiB"}})
    assert _by_code(run_static_preflight(offload).findings)["P003"] == "error"


def test_r4_corrected_fits() -> None:
    fixed = make_recipe(
        R4,
        training={"per_device_batch_size": 1, "gradient_accumulation_steps": 16},
        data={"max_seq_length": 512},
    )
    result = preflight_for_host(fixed, RTX_24GB, QWEN25_7B)
    assert _errors(result.findings) == []
    assert not {"M001", "M002"} & set(_by_code(result.findings))


def test_base_recipe_records_no_finding() -> None:
    # Non-reentrant checkpointing (the default) needs no input grads: G007 is not emitted.
    assert BASE["data"]["num_workers"] == 0
    assert _by_code(run_static_preflight(make_recipe()).findings) == {}
