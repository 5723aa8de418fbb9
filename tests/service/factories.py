"""Recipes, inventories and request headers for the service tests."""

from __future__ import annotations

import copy
from typing import Any

USER_TOKEN = "user-token-for-tests"
WORKER_TOKEN = "worker-token-for-tests"
USER = {"Authorization": f"Bearer {USER_TOKEN}"}
WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}

_RECIPE: dict[str, Any] = {
    "name": "tiny-lora",
    "model": {"path": "models/tiny-llama", "dtype": "float32"},
    "data": {"train": [{"path": "data/chartqa.jsonl", "preset": "chartqa"}], "num_workers": 0},
    "training": {"precision": "fp32", "max_steps": 5, "gradient_accumulation_steps": 1},
    "resources": {"gpus_per_node": 2, "accelerator": "any"},
}


def recipe(**overrides: Any) -> dict[str, Any]:
    """A valid recipe; keyword arguments replace top-level keys."""
    return copy.deepcopy(_RECIPE) | overrides


def cpu_inventory(slots: int = 2) -> dict[str, Any]:
    return {
        "hostname": "cpu-host",
        "cpu_slots": slots,
        "cores": 2,
        "workspace": "/ws",
        "runs_dir": "/ws/runs",
    }


def gpu_inventory(count: int, name: str = "NVIDIA A100-SXM4-40GB", capability: str = "8.0") -> dict[str, Any]:
    gpus = [
        {"index": i, "name": name, "memory_mb": 40960, "compute_capability": capability} for i in range(count)
    ]
    return {"hostname": "gpu-host", "gpus": gpus, "cores": 32, "workspace": "/ws", "runs_dir": "/ws/runs"}
