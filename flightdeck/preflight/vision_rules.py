"""Static rules of vision-language recipes (V004, V005); the host checks V001-V003 with the real model."""

from __future__ import annotations

from flightdeck.memory.architecture import ModelShape
from flightdeck.preflight.rule_result import RuleResult, correction
from flightdeck.recipe.schema import Recipe


def image_columns_removed(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """V004: the Trainer's unused-column removal drops the image before the collator sees it."""
    training = recipe.training
    if recipe.task != "vision_language" or training is None or not training.remove_unused_columns:
        return []
    return [
        correction(
            "V004",
            "training.remove_unused_columns",
            "remove_unused_columns drops every sample key the model's forward does not take, the image and "
            "the question among them: the collator would fail with KeyError: 'image'.",
            "remove_unused_columns=false (the collator builds the model's inputs itself)",
            {"training.remove_unused_columns": False},
        )
    ]


def _tower_trained(stage: Recipe) -> bool:
    """Whether a stage leaves the vision tower's own weights trainable (full fine-tune, tower not frozen)."""
    model = stage.model
    return model is not None and stage.adapter is None and "vision_tower" not in model.freeze


def trained_tower_quantised(stage: Recipe, previous: Recipe | None) -> list[RuleResult]:
    """V005: a stage that quantises the model whose tower the previous stage trained must skip the tower."""
    model = stage.model
    if model is None:
        return []
    if (
        previous is None
        or stage.task != "vision_language"
        or not model.quantization
        or not _tower_trained(previous)
        or "vision_tower" in model.quantization_skip_modules
    ):
        return []
    skip = [*model.quantization_skip_modules, "vision_tower"]
    return [
        correction(
            "V005",
            "model.quantization_skip_modules",
            f"this stage loads the previous stage's output in {model.quantization} and the previous "
            "stage trained the vision tower: quantising it throws that training away (a skip list such as "
            "['visual'] that is not the tower's full prefix skips nothing).",
            "the tower is kept in full precision ('vision_tower' resolves to its full module prefix) and "
            "the trainer verifies after loading that none of its linears is quantised",
            {"model.quantization_skip_modules": skip},
        )
    ]


VISION_RULES = (image_columns_removed,)
