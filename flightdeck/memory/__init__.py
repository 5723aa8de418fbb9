"""Memory estimator: per-GPU peak memory from a model's config.json, without torch.

model_shape(config: Mapping[str, Any]) -> ModelShape | None
estimate_memory(recipe: Recipe, shape: ModelShape) -> MemoryEstimate   (bytes; .summary() in GB)
cheapest_fitting_change(recipe, shape, budget_bytes) -> FittingChange | None
"""

from flightdeck.memory.architecture import ModelShape, lora_parameters, matches_target, model_shape
from flightdeck.memory.estimate import GB, MemoryEstimate, estimate_memory
from flightdeck.memory.fitting import FittingChange, cheapest_fitting_change

__all__ = [
    "GB",
    "FittingChange",
    "MemoryEstimate",
    "ModelShape",
    "cheapest_fitting_change",
    "estimate_memory",
    "lora_parameters",
    "matches_target",
    "model_shape",
]
