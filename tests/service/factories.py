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


# Each registered worker's own token (the registration answer's `token`), by worker id and by the
# attempts it claimed: a worker reports only on itself and on its own attempts.
WORKER_AUTH: dict[int, dict[str, str]] = {}
ATTEMPT_AUTH: dict[int, dict[str, str]] = {}


def enrolled(answer: Any) -> int:
    """Record a registration answer's token; the worker's id."""
    body = answer.json()
    WORKER_AUTH[int(body["id"])] = {"Authorization": f"Bearer {body['token']}"}
    return int(body["id"])


def as_worker(worker_id: int) -> dict[str, str]:
    return WORKER_AUTH[worker_id]


def claimed_by(worker_id: int, attempt: Any) -> Any:
    """Remember who claimed `attempt` (a claim answer's attempt, or None); returns it."""
    if attempt:
        ATTEMPT_AUTH[int(attempt["id"])] = WORKER_AUTH[worker_id]
    return attempt


def as_owner(attempt: Any) -> dict[str, str]:
    """The headers of the worker that claimed `attempt` (an attempt dict or its id)."""
    return ATTEMPT_AUTH[int(attempt["id"] if isinstance(attempt, dict) else attempt)]
