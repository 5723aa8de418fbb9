"""G015: gradient accumulation with a model whose forward takes no loss kwargs (`num_items_in_batch`).

The HF Trainer normalises an accumulated loss by the number of supervised tokens in the whole
accumulation window only when the model's forward accepts `num_items_in_batch` (transformers#35203,
#37766). Otherwise it averages each micro-batch's mean loss: a micro-batch with few supervised tokens
weighs as much as one with many, so the loss (and gradient) differ from the same batch taken at once.
"""

from __future__ import annotations

from typing import Any

from flightdeck.preflight.rule_result import RuleResult, warn
from flightdeck.recipe.schema import Recipe


def accumulation_without_loss_kwargs(recipe: Recipe, probe: Any) -> list[RuleResult]:
    """G015: accumulation > 1 and a forward the Trainer cannot pass `num_items_in_batch` to."""
    training = recipe.training
    if training is None or training.gradient_accumulation_steps <= 1 or probe.accepts_loss_kwargs:
        return []
    steps = training.gradient_accumulation_steps
    architecture = (probe.config.get("architectures") or [probe.model_type])[0]
    return [
        warn(
            "G015",
            "training.gradient_accumulation_steps",
            f"gradient_accumulation_steps is {steps} but {architecture}'s forward takes no loss kwargs "
            "(num_items_in_batch), so the Trainer averages the mean loss of each micro-batch instead of "
            "dividing by the supervised tokens of the whole accumulated batch: micro-batches with few "
            "answer tokens weigh as much as long ones and the loss differs from one large batch "
            "(transformers#35203). Set gradient_accumulation_steps to 1 and multiply "
            f"per_device_batch_size by {steps} (same global batch) if memory allows, or use a model class "
            "whose forward accepts **kwargs.",
            "host",
        )
    ]
