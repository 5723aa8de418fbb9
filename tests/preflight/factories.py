"""Recipe and inventory factories for the preflight tests."""

from __future__ import annotations

from typing import Any

from flightdeck.inventory import GpuInfo, WorkerInventory
from flightdeck.memory.reference_models import LLAMA2_7B  # noqa: F401  (re-exported for the tests)
from flightdeck.recipe.schema import Recipe
from flightdeck.recipe.validate import deep_merge

# A quiet base: single GPU, no loader workers, tokenizers env set, so each test adds only its trigger.
BASE: dict[str, Any] = {
    "name": "preflight-test",
    "model": {"path": "models/tiny-llama"},
    "data": {"train": [{"path": "data/train.jsonl"}], "num_workers": 0},
    "env": {"TOKENIZERS_PARALLELISM": "false"},
}


def make_recipe(*layers: dict[str, Any], **overrides: Any) -> Recipe:
    """BASE deep-merged with each layer, then with `overrides` given as section=dict."""
    merged = BASE
    for layer in (*layers, overrides):
        merged = deep_merge(merged, layer)
    return Recipe.model_validate(merged)


def gpu(
    index: int = 0, name: str = "NVIDIA A100-SXM4-40GB", memory_mb: int = 40960, cc: str = "8.0"
) -> GpuInfo:
    return GpuInfo(index=index, name=name, memory_mb=memory_mb, compute_capability=cc)


def inventory(count: int = 1, cores: int = 32, **gpu_kwargs: Any) -> WorkerInventory:
    return WorkerInventory(gpus=[gpu(i, **gpu_kwargs) for i in range(count)], cores=cores)
