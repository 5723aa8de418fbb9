"""Model set-up order (R1): freeze the base, add the adapter, re-enable adapters not named by a pattern."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flightdeck.recipe import parse_recipe
from flightdeck.worker.train.model import load_model


def _load(workspace: Path, freeze: list[str]) -> Any:
    recipe = parse_recipe(
        {
            "name": "t",
            "model": {"path": "models/tiny-llama", "dtype": "float32", "freeze": freeze},
            "adapter": {"r": 4, "target_modules": ["q_proj", "v_proj"]},
            "data": {"train": [{"path": "d.jsonl"}]},
        }
    )
    return load_model(recipe, str(workspace / "models" / "tiny-llama"), local_rank=0, use_cpu=True).model


def _trainable(model: Any) -> set[str]:
    return {n.removeprefix("base_model.model.") for n, p in model.named_parameters() if p.requires_grad}


def test_adapters_inside_a_frozen_submodule_stay_trainable(workspace: Path) -> None:
    model = _load(workspace, [r"^model\.layers\.0\."])
    trainable = _trainable(model)
    assert "model.layers.0.self_attn.q_proj.lora_A.default.weight" in trainable
    assert "model.layers.0.self_attn.v_proj.lora_B.default.weight" in trainable
    assert all(".lora_" in name for name in trainable)
    assert len(trainable) == 8
    assert model.training  # from_pretrained returns eval mode in transformers 5


def test_a_pattern_naming_the_adapter_itself_freezes_it(workspace: Path) -> None:
    assert {n.split(".lora_")[1][0] for n in _trainable(_load(workspace, ["lora_A"]))} == {"B"}
    assert _trainable(_load(workspace, ["lora_"])) == set()


def test_the_recipes_attention_implementation_reaches_from_pretrained(workspace: Path) -> None:
    """X004: preflight rewrites flash_attention_2 to sdpa on pre-Ampere GPUs; the fix holds only if the
    trainer loads the model with the recipe's attn_implementation (transformers' default is sdpa)."""
    for implementation in ("eager", "sdpa"):
        recipe = parse_recipe(
            {
                "name": "t",
                "model": {
                    "path": "models/tiny-llama",
                    "dtype": "float32",
                    "attn_implementation": implementation,
                },
                "adapter": {"r": 4, "target_modules": ["q_proj", "v_proj"]},
                "data": {"train": [{"path": "d.jsonl"}]},
            }
        )
        model = load_model(recipe, str(workspace / "models" / "tiny-llama"), local_rank=0, use_cpu=True).model
        assert model.config._attn_implementation == implementation
