"""Property: a fix never produces a recipe the trainer refuses.

For every rule that writes into the effective recipe, a recipe that triggers it (single-stage, and
multi-stage with the trigger at the top level and, where a stage may carry it, inside one stage) gives
an effective recipe that `parse_recipe` accepts: the trainer parses exactly that recipe again. The set
of rules is read from the rule modules' source, so a new fix that writes into the recipe fails here
until it has a case.
"""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from flightdeck.preflight import engine, preflight_for_host, run_static_preflight
from flightdeck.recipe import RecipeInvalid, parse_recipe
from flightdeck.recipe.schema import Recipe
from flightdeck.recipe.validate import deep_merge
from flightdeck.service import jobs

from .factories import BASE, LLAMA2_7B, inventory

REPO = Path(__file__).resolve().parents[2]
PREFLIGHT = REPO / "flightdeck" / "preflight"
R2_EXAMPLE = REPO / "examples" / "r2-text-stand-in-two-stage.json"
TURING = inventory(2, name="Tesla T4", memory_mb=15360, cc="7.5")
VISION = {"task": "vision_language", "model": {"path": "models/tiny-qwen2-vl"}}


def _two_stages(stage_two: dict[str, Any] | None = None) -> dict[str, Any]:
    """Two stages as R2 has them: a full fine-tune of one layer, then an adapter over its output."""
    return {
        "stages": [
            {"adapter": None, "model": {"freeze": [r"^(?!model\.layers\.1\.)"]}},
            deep_merge({"model": {"path": "@previous"}, "adapter": {"r": 8}}, stage_two or {}),
        ]
    }


# code -> (top-level trigger, trigger a stage may carry itself or None, model_config, inventory)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None, Any]] = {
    "P001": (
        {
            "model": {"device_map": "auto"},
            "env": {"SHIRG_NO_DEVICE_MAP": "1"},
            "resources": {"gpus_per_node": 2},
        },
        None,  # device_map and env belong to the launch: a stage may not differ
        None,
        None,
    ),
    "G004": (
        {"model": {"gradient_checkpointing_reentrant": True}, "resources": {"gpus_per_node": 2}},
        {"model": {"gradient_checkpointing_reentrant": True}},
        None,
        None,
    ),
    "G008": ({"model": {"use_cache": True}}, {"model": {"use_cache": True}}, None, None),
    "X003": (
        {"adapter": None, "model": {"dtype": "float16"}, "training": {"precision": "fp16"}},
        {"adapter": None, "model": {"dtype": "float16"}, "training": {"precision": "fp16"}},
        None,
        None,
    ),
    "E004": ({"env": {"TOKENIZERS_PARALLELISM": None}}, None, None, None),
    "D006": ({"data": {"max_seq_length": 8192}}, {"data": {"max_seq_length": 8192}}, LLAMA2_7B, None),
    "V004": (
        {**VISION, "training": {"remove_unused_columns": True}},
        {"training": {"remove_unused_columns": True}},
        None,
        None,
    ),
    "X004": (
        {
            "model": {"attn_implementation": "flash_attention_2", "dtype": "float32"},
            "training": {"precision": "fp16"},
        },
        {"model": {"attn_implementation": "flash_attention_2"}},
        None,
        TURING,
    ),
}
# V005 exists only between stages: stage 1 trains the tower, stage 2 loads its output in 4-bit.
V005 = {
    **VISION,
    "stages": [
        {"adapter": None, "model": {"freeze": ["language_model"]}},
        {"model": {"path": "@previous", "quantization": "4bit"}},
    ],
}


def _payload(*layers: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = copy.deepcopy(BASE)
    for layer in layers:
        merged = deep_merge(merged, layer)
    if merged["env"].get("TOKENIZERS_PARALLELISM", "") is None:
        merged["env"] = {k: v for k, v in merged["env"].items() if k != "TOKENIZERS_PARALLELISM"}
    return merged


def _shapes(code: str) -> list[tuple[str, dict[str, Any]]]:
    top, in_stage, _, _ = CASES[code]
    shapes = [("single-stage", _payload(top)), ("two-stage, top level", _payload(top, _two_stages()))]
    if in_stage is not None:
        base = {k: v for k, v in top.items() if k in ("task", "resources", "env")}
        shapes.append(("two-stage, in stage 2", _payload(base, _two_stages(in_stage))))
    return shapes


def _fix_writing_codes() -> set[str]:
    """Codes of every `correction(...)` in flightdeck/preflight that passes recipe changes."""
    codes = set()
    for module in PREFLIGHT.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "correction"):
                continue
            changes = node.args[4] if len(node.args) > 4 else None
            changes = changes or next((k.value for k in node.keywords if k.arg == "changes"), None)
            if changes is not None and isinstance(node.args[0], ast.Constant):
                codes.add(str(node.args[0].value))
    return codes


def _effective(code: str, payload: dict[str, Any]) -> tuple[Recipe, list[Any]]:
    _, _, model_config, host = CASES.get(code, ({}, None, None, None))
    recipe = parse_recipe(payload)  # the trigger is a valid recipe
    if host is not None:
        dry = preflight_for_host(recipe, host, model_config)
        return dry.effective, dry.findings
    static = run_static_preflight(recipe, model_config=model_config)
    return static.effective, static.findings


def test_every_rule_that_writes_into_the_recipe_has_a_case() -> None:
    assert _fix_writing_codes() == set(CASES) | {"V005"}


@pytest.mark.parametrize(
    ("code", "shape", "payload"),
    [(code, shape, payload) for code in CASES for shape, payload in _shapes(code)]
    + [("V005", "two-stage, between stages", _payload(V005))],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_fix_gives_an_effective_recipe_the_trainer_accepts(
    code: str, shape: str, payload: dict[str, Any]
) -> None:
    effective, findings = _effective(code, payload)
    fixes = [f for f in findings if f.code == code and f.severity == "fix"]
    assert fixes, f"{code} did not trigger ({shape}): {[(f.code, f.path) for f in findings]}"
    assert effective.model_dump(mode="json") != parse_recipe(payload).model_dump(mode="json")
    parse_recipe(effective.model_dump(mode="json"))  # raises RecipeInvalid if the fix broke it


def test_d006_never_caps_below_the_shortest_sequence_a_recipe_may_ask_for() -> None:
    tiny_positions = {**LLAMA2_7B, "max_position_embeddings": 4}
    result = run_static_preflight(parse_recipe(_payload()), model_config=tiny_positions)
    d006 = [f for f in result.findings if f.code == "D006"]
    assert [f.severity for f in d006] == ["error"]
    parse_recipe(result.effective.model_dump(mode="json"))


def test_every_example_submits_to_an_effective_recipe_the_trainer_accepts() -> None:
    for example in sorted((REPO / "examples").glob("*.json")):
        _, effective, _ = jobs.validate_submission(json.loads(example.read_text()))
        parse_recipe(effective.model_dump(mode="json"))


def _r2_with_device_map_and_ddp_switch() -> dict[str, Any]:
    """The audit's reproduction: the R2 example, a top-level device map and SHIRG_NO_DEVICE_MAP=1."""
    payload = json.loads(R2_EXAMPLE.read_text())
    payload["model"]["device_map"] = "auto"
    payload.setdefault("env", {})["SHIRG_NO_DEVICE_MAP"] = "1"
    payload["resources"]["gpus_per_node"] = 2
    return payload


def test_the_p001_fix_of_a_two_stage_recipe_is_one_the_trainer_accepts() -> None:
    _, effective, findings = jobs.validate_submission(_r2_with_device_map_and_ddp_switch())
    assert {f.code for f in findings if f.severity == "fix"} >= {"P001"}
    assert effective.model is not None and effective.model.device_map is None
    assert effective.stages is not None
    assert all(stage.get("model", {}).get("device_map") is None for stage in effective.stages)
    parse_recipe(effective.model_dump(mode="json"))


def test_submission_is_refused_when_a_fix_would_break_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard: a fix that wrote a recipe the trainer refuses (P001 written into each stage only, as
    before shared paths existed) refuses the submission, naming the fix, instead of queueing a job that
    can only fail."""
    monkeypatch.setattr(engine, "SHARED_PATHS", frozenset())
    with pytest.raises(RecipeInvalid) as refused:
        jobs.validate_submission(_r2_with_device_map_and_ddp_switch())
    first = refused.value.findings[0]
    assert first.code == "P001" and first.severity == "error"
    assert first.path == "stages[0].model.device_map"
    assert "Flightdeck bug" in first.message and "model.device_map set to null" in first.message


def test_the_p001_fix_reaches_a_stage_that_names_the_same_device_map() -> None:
    """A stage may repeat the launch's device map; the fix must change it there too, or the stage
    would disagree with the top level and the trainer would refuse the recipe."""
    payload = _r2_with_device_map_and_ddp_switch()
    payload["stages"][1].setdefault("model", {})["device_map"] = "auto"
    _, effective, _ = jobs.validate_submission(payload)
    assert effective.stages is not None and effective.stages[1]["model"]["device_map"] is None
    parse_recipe(effective.model_dump(mode="json"))
