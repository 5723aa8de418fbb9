"""The recipe schema: defaults, unknown keys, ranges, env allow-list, stages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightdeck.recipe import RecipeInvalid, expand_stages, parse_recipe, recipe_json_schema
from flightdeck.recipe.near_keys import misspelling, other_tools_name
from tests.service.factories import recipe

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def problems(payload: object) -> dict[str, str | None]:
    with pytest.raises(RecipeInvalid) as caught:
        parse_recipe(payload)
    return {f.path: f.code for f in caught.value.findings}


def test_defaults_follow_design() -> None:
    parsed = parse_recipe({"name": "x", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]}})
    assert parsed.task == "causal_lm"
    assert parsed.model.gradient_checkpointing is True and parsed.model.device_map is None
    assert parsed.adapter is not None and parsed.adapter.r == 16 and parsed.adapter.alpha == 32
    assert parsed.adapter.target_modules == ["q_proj", "v_proj"]
    assert parsed.training.learning_rate == 1.8e-5 and parsed.training.gradient_accumulation_steps == 32
    assert parsed.health.zero_grad_patience == 2 and parsed.health.grad_norm_limit == 1000.0


def test_every_problem_is_reported_at_once_with_its_path() -> None:
    payload = recipe(bogus=1)
    payload["model"]["colour"] = "red"
    payload["training"]["learning_rate"] = -1
    payload["training"]["per_device_batch_size"] = 0
    payload["adapter"] = {"r": 0, "dropout": 1.0}
    found = problems(payload)
    assert set(found) == {
        "bogus",
        "model.colour",
        "training.learning_rate",
        "training.per_device_batch_size",
        "adapter.r",
        "adapter.dropout",
    }


def test_nested_list_paths_use_brackets() -> None:
    payload = recipe()
    payload["data"]["train"].append({"path": "", "preset": "nope"})
    assert set(problems(payload)) == {"data.train[1].path", "data.train[1].preset"}


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("OMP_NUM_THREADS", "4", True),
        ("OMP_NUM_THREADS", "0", False),
        ("NCCL_P2P_DISABLE", "1", True),
        ("NCCL_DEBUG", "$(rm -rf /)", False),
        ("MASTER_PORT", "80", False),
        ("MASTER_PORT", "29500", True),
        ("LD_PRELOAD", "/tmp/x.so", False),
        ("RANK", "0", False),
        ("HF_TOKEN", "secret", False),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", True),
        ("TOKENIZERS_PARALLELISM", "false\nRANK=1", False),
        ("NCCL_SOCKET_IFNAME", "eth0", False),  # interfaces, addresses, ids: only the plan sets them
        ("NCCL_COMM_ID", "10.0.0.1:28028", False),
        ("NCCL_RAS_ADDR", "0.0.0.0:28028", False),
        ("NCCL_HOSTID", "h", False),
        ("NCCL_DEBUG_FILE", "/etc/cron.d/x", False),
        ("NCCL_NET_PLUGIN", "evil", False),
        ("NCCL_TOPO_DUMP_FILE", "/tmp/x", False),
        ("HF_ENDPOINT", "http://attacker", False),
        ("HF_HUB_CACHE", "/tmp/elsewhere", False),
        ("HF_HOME", "/tmp/elsewhere", False),
        ("HF_HUB_OFFLINE", "1", True),
        ("TRANSFORMERS_CACHE", "/tmp/elsewhere", False),
    ],
)
def test_env_allow_list_and_values(name: str, value: str, ok: bool) -> None:
    payload = recipe(env={name: value})
    if ok:
        assert parse_recipe(payload).env == {name: value}
    else:
        assert problems(payload) == {f"env.{name}": "E006"}


def test_stages_merge_over_the_base_and_lists_replace() -> None:
    payload = recipe(
        stages=[
            {"adapter": None, "model": {"freeze": ["^model\\.layers\\.1\\."]}},
            {"model": {"path": "@previous", "quantization": "4bit"}, "training": {"learning_rate": 1e-4}},
        ]
    )
    first, second = expand_stages(parse_recipe(payload))
    assert first.adapter is None and first.model.freeze == ["^model\\.layers\\.1\\."]
    assert second.model.path == "@previous" and second.model.quantization == "4bit"
    assert second.model.freeze == [] and second.adapter is not None
    assert second.training.learning_rate == 1e-4 and second.training.max_steps == 5


def test_previous_only_from_the_second_stage() -> None:
    assert "model.path" in problems(recipe(model={"path": "@previous"}))
    assert "stages[0].model.path" in problems(recipe(stages=[{"model": {"path": "@previous"}}]))


def test_stage_errors_carry_the_stage_path_once() -> None:
    found = problems(recipe(stages=[{"training": {"epochs": 0}}, {"nonsense": 1}]))
    assert set(found) == {"stages[0].training.epochs", "stages[1].nonsense"}


def test_invalid_freeze_regex_names_the_fix() -> None:
    payload = recipe()
    payload["model"]["freeze"] = ["vision_tower.("]
    with pytest.raises(RecipeInvalid) as caught:
        parse_recipe(payload)
    assert "regular expression" in caught.value.findings[0].message


def test_published_schema_refuses_unknown_keys() -> None:
    schema = recipe_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {
        "name",
        "entrypoint",
        "task",
        "model",
        "adapter",
        "data",
        "training",
        "resources",
        "env",
        "health",
        "stages",
    }


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.name)
def test_examples_are_valid_recipes(path: Path) -> None:
    parse_recipe(json.loads(path.read_text()))


def test_stages_cannot_change_the_launch() -> None:
    """Regression: one torchrun runs every stage, so a stage's resources/env/device_map were ignored."""
    found = problems(
        recipe(
            stages=[
                {"adapter": None},
                {"model": {"path": "@previous", "device_map": "balanced"}, "resources": {"gpus_per_node": 1}},
                {"env": {"OMP_NUM_THREADS": "2"}},
            ]
        )
    )
    assert found == {"stages[1].model.device_map": "P001", "stages[1].resources": None, "stages[2].env": None}


def test_the_published_schema_accepts_every_example_and_says_what_a_job_needs() -> None:
    import json
    from pathlib import Path

    import jsonschema

    schema = recipe_json_schema()
    examples = sorted((Path(__file__).resolve().parents[2] / "examples").rglob("*.json"))
    assert any(p.parent.name == "own-script" for p in examples)
    for path in examples:
        jsonschema.validate(json.loads(path.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "neither a recipe job nor a script job"}, schema)


def test_resources_slurm_is_checked_field_by_field_with_the_form_slurm_takes() -> None:
    good = recipe(resources={"slurm": {"partition": "gpu", "time": "1-12:00:00", "constraint": "a100&ib"}})
    assert parse_recipe(good).resources.slurm is not None
    for time in ("90", "30:00", "04:00:00", "2-00", "2-00:30"):
        parse_recipe(recipe(resources={"slurm": {"time": time}}))
    bad = recipe(
        resources={"slurm": {"partition": "gpu; rm -rf ~", "time": "4h", "constraint": "a100 ib", "qos": "x"}}
    )
    with pytest.raises(RecipeInvalid) as caught:
        parse_recipe(bad)
    found = {f.path: f.message for f in caught.value.findings}
    assert set(found) == {
        "resources.slurm.partition",
        "resources.slurm.time",
        "resources.slurm.constraint",
        "resources.slurm.qos",
    }
    assert (
        "e.g. 04:00:00" in found["resources.slurm.time"]
        and "e.g. a100&ib" in found["resources.slurm.constraint"]
    )


def test_a_near_name_is_offered_only_where_it_can_hold_the_value() -> None:
    # The shape decides (object, list, null, scalar), not the type: "1e-4" is how YAML writes a number.
    cases = [
        (("trainin",), {"max_steps": 3}, "training"),
        (("train_on_inputs",), False, None),
        (("training", "learning_rat"), "1e-4", "learning_rate"),
        (("training", "max_stepz"), None, "max_steps"),
        (("model", "freez"), ["lm_head"], "freeze"),
        (("model", "freez"), "lm_head", None),
        (("data", "train", 0, "type"), "alpaca", "preset"),
        (("data", "eval", 0, "ds_type"), "json", "format"),
        (("datasets",), [{"path": "a.jsonl"}], "data"),  # the value changes anyway: its fix says how
        (("lora",), {"r": 8}, "adapter"),
        (("lora",), True, None),
    ]
    found = [other_tools_name(loc, value) or misspelling(loc, value) for loc, value, _ in cases]
    assert found == [near for _, _, near in cases]


def test_a_saved_peft_config_of_another_method_or_with_a_module_pattern_says_so() -> None:
    # peft writes target_modules as a regular expression when given one, and other methods' peft_type.
    def answer(adapter: dict[str, object]) -> tuple[str, str | None]:
        with pytest.raises(RecipeInvalid) as caught:
            parse_recipe(recipe(adapter=adapter))
        (finding,) = caught.value.findings
        return finding.message, finding.fix

    message, fix = answer({"peft_type": "IA3", "target_modules": ["k_proj"], "feedforward_modules": []})
    assert "peft_type 'IA3'" in message and "Flightdeck trains LoRA adapters" in message
    assert fix is not None and "script job" in fix
    # Hand-edited: module names that are not all text are sorted by their text (no TypeError).
    assert answer({"peft_type": "LORA", "target_modules": ["q_proj", 3]})[1] == (
        'give it as "adapter": {"target_modules": [3, "q_proj"]}'
    )
    message, fix = answer({"peft_type": "LORA", "r": 8, "target_modules": r".*\.(q|v)_proj"})
    assert message.endswith(
        r"its target_modules '.*\\.(q|v)_proj' is a pattern: list the module names it matches"
    )
    assert fix == 'give it as "adapter": {"r": 8, "target_modules": ["..."]}'
