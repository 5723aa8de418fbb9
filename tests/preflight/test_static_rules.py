"""Every static rule: one recipe that triggers it and a close variant that does not."""

from __future__ import annotations

from typing import Any

import pytest

from flightdeck.preflight import run_static_preflight
from flightdeck.recipe.findings import Finding

from .factories import LLAMA2_7B, make_recipe

DDP2 = {"resources": {"gpus_per_node": 2}}

# (id, recipe overrides, expected code, expected severity, close variant that must not trigger)
CASES: list[tuple[str, dict[str, Any], str, str, dict[str, Any]]] = [
    (
        "P001-nodes",
        {"model": {"device_map": "auto"}, "resources": {"nodes": 2, "gpus_per_node": 2}},
        "P001",
        "error",
        {"model": {"device_map": None}, "resources": {"nodes": 2, "gpus_per_node": 2}},
    ),
    (
        "P001-shirg",
        {"model": {"device_map": "auto"}, "env": {"SHIRG_NO_DEVICE_MAP": "1"}},
        "P001",
        "fix",
        {"model": {"device_map": "auto"}, "env": {"SHIRG_NO_DEVICE_MAP": "0"}},
    ),
    (
        "P002",
        {"model": {"device_map": "balanced"}, "resources": {"gpus_per_node": 2}},
        "P002",
        "fix",
        {"model": {"device_map": "balanced"}, "resources": {"gpus_per_node": 1}},
    ),
    (
        "P003",
        {"model": {"device_map": "auto", "max_memory": {"0": "20GiB", "cpu": "64GiB"}}},
        "P003",
        "error",
        {"model": {"device_map": "auto", "max_memory": {"0": "20GiB", "1": "20GiB"}}},
    ),
    ("P006", {"model": {"quantization": "4bit"}, **DDP2}, "P006", "fix", {"model": {"quantization": "4bit"}}),
    (
        "G001-adapter",
        {"model": {"freeze": [r"self_attn"]}},
        "G001",
        "fix",
        {"model": {"freeze": [r"embed_tokens"]}},
    ),
    (
        "G001-nothing-trains",
        {"adapter": None, "model": {"freeze": [r".*"]}},
        "G001",
        "error",
        {"adapter": None, "model": {"freeze": [r"layers\.0\."]}},
    ),
    (
        "G001-names-adapter",
        {"model": {"freeze": ["lora_"]}},
        "G001",
        "error",
        {"model": {"freeze": ["embed_tokens"]}},
    ),
    (
        "G010",
        {"adapter": None, "model": {"quantization": "4bit"}},
        "G010",
        "error",
        {"model": {"quantization": "4bit"}},
    ),
    (
        "G004",
        {"model": {"gradient_checkpointing_reentrant": True}, **DDP2},
        "G004",
        "fix",
        {"model": {"gradient_checkpointing_reentrant": True}},  # one process: reentrant trains (G007)
    ),
    (
        "G004-no-checkpointing",
        {"model": {"gradient_checkpointing_reentrant": True}, **DDP2},
        "G004",
        "fix",
        {"model": {"gradient_checkpointing_reentrant": True, "gradient_checkpointing": False}, **DDP2},
    ),
    (
        "G005",
        {"training": {"ddp_find_unused_parameters": True}, **DDP2},
        "G005",
        "error",
        {"training": {"ddp_find_unused_parameters": True}},
    ),
    ("G007", {"model": {"gradient_checkpointing_reentrant": True}}, "G007", "fix", {}),
    (
        "G007-full-finetune",
        {"model": {"gradient_checkpointing_reentrant": True}},
        "G007",
        "fix",
        {"model": {"gradient_checkpointing_reentrant": True}, "adapter": None},
    ),
    (
        "G007-ddp-made-non-reentrant-by-G004",
        {"model": {"gradient_checkpointing_reentrant": True}},
        "G007",
        "fix",
        {"model": {"gradient_checkpointing_reentrant": True}, **DDP2},
    ),
    (
        "G008",
        {"model": {"use_cache": True}},
        "G008",
        "fix",
        {"model": {"use_cache": True, "gradient_checkpointing": False}},
    ),
    (
        "X003-full",
        {"adapter": None, "model": {"dtype": "float16"}, "training": {"precision": "fp16"}},
        "X003",
        "fix",
        {"adapter": None, "model": {"dtype": "float32"}, "training": {"precision": "fp16"}},
    ),
    (
        "X003-adapter",
        {"model": {"dtype": "float16"}, "training": {"precision": "fp16"}},
        "X003",
        "fix",
        {"model": {"dtype": "float16"}, "training": {"precision": "fp32"}},
    ),
    ("E001", {"data": {"num_workers": 2}}, "E001", "fix", {"data": {"num_workers": 0}}),
    ("E004", {"env": {}}, "E004", "fix", {"env": {"TOKENIZERS_PARALLELISM": "true"}}),
]


def _find(findings: list[Finding], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def _recipe(overrides: dict[str, Any]) -> Any:
    if overrides.get("env") == {}:
        return make_recipe(**{k: v for k, v in overrides.items() if k != "env"}).model_copy(
            update={"env": {}}
        )
    return make_recipe(**overrides)


@pytest.mark.parametrize(
    ("overrides", "code", "severity", "variant"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule_triggers_and_close_variant_does_not(
    overrides: dict[str, Any], code: str, severity: str, variant: dict[str, Any]
) -> None:
    hits = _find(run_static_preflight(_recipe(overrides)).findings, code)
    assert [f.severity for f in hits] == [severity]
    assert hits[0].path and hits[0].message
    if severity == "fix":
        assert hits[0].fix
    assert _find(run_static_preflight(_recipe(variant)).findings, code) == []


def test_fixes_are_applied_to_the_effective_recipe_and_recorded() -> None:
    recipe = make_recipe(
        model={"device_map": "auto", "gradient_checkpointing_reentrant": True, "use_cache": True},
        env={"SHIRG_NO_DEVICE_MAP": "1"},
        resources={"gpus_per_node": 2},
    ).model_copy(update={"env": {"SHIRG_NO_DEVICE_MAP": "1"}})
    result = run_static_preflight(recipe)
    effective = result.effective
    assert effective.model.device_map is None
    assert effective.model.gradient_checkpointing_reentrant is False
    assert effective.model.use_cache is False
    assert effective.env["TOKENIZERS_PARALLELISM"] == "false"
    recorded = {
        f.path: f.value for f in result.findings if f.severity == "fix" and f.code in ("P001", "E004")
    }
    assert recorded == {"model.device_map": None, "env.TOKENIZERS_PARALLELISM": "false"}
    # The submitted recipe is left as it was.
    assert recipe.model.device_map == "auto"


def test_full_finetune_fp16_is_moved_to_float32_weights() -> None:
    recipe = make_recipe(adapter=None, model={"dtype": "float16"}, training={"precision": "fp16"})
    assert run_static_preflight(recipe).effective.model.dtype == "float32"


def test_sequence_beyond_positions_needs_the_config() -> None:
    recipe = make_recipe(data={"max_seq_length": 8192})
    assert _find(run_static_preflight(recipe).findings, "D006") == []
    result = run_static_preflight(recipe, model_config=LLAMA2_7B)
    assert [f.value for f in _find(result.findings, "D006")] == [4096]
    assert result.effective.data.max_seq_length == 4096
    fitting = make_recipe(data={"max_seq_length": 4096})
    assert _find(run_static_preflight(fitting, model_config=LLAMA2_7B).findings, "D006") == []


def test_freeze_is_matched_against_the_real_layout_when_known() -> None:
    # 'mlp' freezes MLPs only; with q/v adapters it does not touch adapter targets.
    recipe = make_recipe(model={"freeze": ["mlp"]})
    assert _find(run_static_preflight(recipe, model_config=LLAMA2_7B).findings, "G001") == []
    targets_mlp = make_recipe(model={"freeze": ["mlp"]}, adapter={"target_modules": "all-linear"})
    assert _find(run_static_preflight(targets_mlp, model_config=LLAMA2_7B).findings, "G001")


def test_stages_are_checked_one_by_one_and_fixed_in_place() -> None:
    recipe = make_recipe(
        stages=[
            {"adapter": None, "model": {"freeze": ["layers"]}},
            {
                "model": {
                    "path": "@previous",
                    "quantization": "4bit",
                    "device_map": "balanced",
                    "use_cache": True,
                }
            },
        ],
        resources={"gpus_per_node": 2},
    )
    result = run_static_preflight(recipe)
    paths = {(f.code, f.path) for f in result.findings}
    assert ("P002", "stages[1].model.device_map") in paths
    assert ("G008", "stages[1].model.use_cache") in paths
    assert not any(f.path.startswith("stages[0].") and f.code in ("P002", "G008") for f in result.findings)
    assert result.effective.stages is not None
    assert result.effective.stages[1]["model"]["use_cache"] is False


def test_freezing_all_but_one_layer_without_a_config_is_not_g001() -> None:
    """Regression: R2's stage 1 keeps layer 1 trainable; the generic probe names only knew layer 0."""
    stage_one = _recipe({"adapter": None, "model": {"freeze": [r"^(?!model\.layers\.1\.)"]}})
    assert _find(run_static_preflight(stage_one).findings, "G001") == []


def test_g001_names_real_modules_and_suggests_the_close_name_of_a_mistyped_target() -> None:
    """The newcomer's case: freeze layer 0 with a typo'd target; no made-up 'block' parameter is named."""
    recipe = make_recipe(
        model={"freeze": [r"^model\.layers\.0\."]}, adapter={"target_modules": ["qq_proj", "v_proj"]}
    )
    (g001,) = _find(run_static_preflight(recipe).findings, "G001")
    assert ".block." not in g001.message and ".weight" not in g001.message, g001.message
    assert "model.layers.0.self_attn.v_proj" in g001.message, g001.message
    assert "'qq_proj' is no module name" in g001.message and "did you mean 'q_proj'" in g001.message
    # With the model's config the modules named are the model's own.
    known = make_recipe(model={"freeze": ["self_attn"]}, adapter={"target_modules": ["q_proj"]})
    (real,) = _find(run_static_preflight(known, model_config=LLAMA2_7B).findings, "G001")
    assert "model.layers.0.self_attn.q_proj" in real.message and "did you mean" not in real.message


def test_a_near_miss_of_a_placeholder_in_a_scripts_args_is_a_warning_naming_the_placeholder() -> None:
    from flightdeck.recipe import parse_recipe

    args = ["--out", "{outdir}/ckpt", "--template", "{instruction}: {input}", "{run_dir}", "{resume_from}"]
    recipe = parse_recipe({"name": "s", "entrypoint": {"script": "train.py", "args": args}})
    warned = [f for f in run_static_preflight(recipe).findings if f.path.startswith("entrypoint.args")]
    assert [(f.severity, f.path) for f in warned] == [("warn", "entrypoint.args[1]")], warned
    assert "'{outdir}' is not a placeholder" in warned[0].message and "'{output_dir}'" in warned[0].message
