"""The cheapest recipe change that brings the memory estimate under a budget, found by re-estimating."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flightdeck.memory.architecture import ModelShape
from flightdeck.memory.estimate import MemoryEstimate, estimate_memory
from flightdeck.recipe.schema import Recipe

# Shortest sequence we would ever suggest; below this most supervised samples no longer fit.
MIN_SUGGESTED_SEQUENCE = 128


@dataclass(frozen=True)
class FittingChange:
    """A change to the recipe (paths -> values), what it costs, and the estimate after it."""

    description: str
    changes: dict[str, object]
    estimate: MemoryEstimate


def _with(recipe: Recipe, changes: dict[str, object]) -> Recipe:
    data = recipe.model_dump(mode="json")
    for path, value in changes.items():
        section, key = path.split(".")
        data[section][key] = value
    return Recipe.model_validate(data)


def _checkpointing(recipe: Recipe) -> tuple[str, dict[str, object]] | None:
    if recipe.need_model().gradient_checkpointing:
        return None
    return "turn on gradient checkpointing (~30% slower steps, same results)", {
        "model.gradient_checkpointing": True
    }


def _batch_one(recipe: Recipe) -> tuple[str, dict[str, object]] | None:
    batch = recipe.need_training().per_device_batch_size
    if batch == 1:
        return None
    accumulation = recipe.need_training().gradient_accumulation_steps * batch
    return (
        f"per_device_batch_size 1 with gradient_accumulation_steps {accumulation} (same effective batch)",
        {
            "training.per_device_batch_size": 1,
            "training.gradient_accumulation_steps": accumulation,
        },
    )


def _eight_bit_optimizer(recipe: Recipe) -> tuple[str, dict[str, object]] | None:
    if recipe.need_training().optimizer != "adamw_torch":
        return None
    return "optimizer adamw_8bit (Adam moments in 8 bits)", {"training.optimizer": "adamw_8bit"}


def _four_bit(recipe: Recipe) -> tuple[str, dict[str, object]] | None:
    if recipe.need_model().quantization == "4bit" or recipe.adapter is None:
        return None  # a quantised base can only be trained through an adapter
    return "load the base in 4-bit (QLoRA: quantization '4bit')", {"model.quantization": "4bit"}


CANDIDATES: tuple[Callable[[Recipe], tuple[str, dict[str, object]] | None], ...] = (
    _checkpointing,
    _batch_one,
    _eight_bit_optimizer,
    _four_bit,
)


def _longest_fitting_sequence(recipe: Recipe, shape: ModelShape, budget: float) -> FittingChange | None:
    length = recipe.need_data().max_seq_length // 2
    while length >= MIN_SUGGESTED_SEQUENCE:
        candidate = _with(recipe, {"data.max_seq_length": length})
        estimate = estimate_memory(candidate, shape)
        if estimate.total <= budget:
            return FittingChange(
                f"max_seq_length {length} (longer samples are truncated)",
                {"data.max_seq_length": length},
                estimate,
            )
        length //= 2
    return None


def _merged(steps: list[tuple[str, dict[str, object]]]) -> dict[str, object]:
    changes: dict[str, object] = {}
    for _, step in steps:
        changes |= step
    return changes


def _without_unneeded(
    recipe: Recipe, shape: ModelShape, budget: float, steps: list[tuple[str, dict[str, object]]]
) -> FittingChange:
    """Drop each change (cheapest first) that the rest fit without."""
    kept = list(steps)
    for step in steps:
        rest = [s for s in kept if s is not step]
        if rest and estimate_memory(_with(recipe, _merged(rest)), shape).total <= budget:
            kept = rest
    estimate = estimate_memory(_with(recipe, _merged(kept)), shape)
    return FittingChange(" + ".join(d for d, _ in kept), _merged(kept), estimate)


def cheapest_fitting_change(recipe: Recipe, shape: ModelShape, budget: float) -> FittingChange | None:
    """Try each change alone (cheapest first), then accumulate them, then shorten sequences."""
    for candidate in CANDIDATES:
        proposal = candidate(recipe)
        if proposal is None:
            continue
        description, changes = proposal
        estimate = estimate_memory(_with(recipe, changes), shape)
        if estimate.total <= budget:
            return FittingChange(description, changes, estimate)
    steps: list[tuple[str, dict[str, object]]] = []
    current = recipe
    for candidate in CANDIDATES:
        proposal = candidate(current)
        if proposal is None:
            continue
        steps.append(proposal)
        current = _with(recipe, _merged(steps))
        if len(steps) > 1 and estimate_memory(current, shape).total <= budget:
            return _without_unneeded(recipe, shape, budget, steps)
    shorter = _longest_fitting_sequence(current, shape, budget)
    if shorter is None:
        return None
    steps.append((shorter.description, shorter.changes))
    return _without_unneeded(recipe, shape, budget, steps)
