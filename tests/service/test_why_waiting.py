"""Why a queued job waits: the words agree with the claim's own test of what fits."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from flightdeck.inventory import WorkerInventory
from flightdeck.service.why_waiting import Needs, unmet, waiting_reason
from tests.service.factories import USER, cpu_inventory, gpu_inventory, recipe
from tests.service.test_worker_api import claim, register

INVENTORIES = {
    "cpu2": cpu_inventory(2),
    "cpu2-no-scripts": cpu_inventory(2) | {"runs_scripts": False},
    "v100x4": gpu_inventory(4, "Tesla V100-SXM2-32GB", "7.0"),
    "a100x2": gpu_inventory(2),
    "a100x8": gpu_inventory(8),
}
JOBS: dict[str, dict[str, Any]] = {
    "cpu-2": recipe(resources={"gpus_per_node": 2, "accelerator": "cpu"}),
    "any-2": recipe(resources={"gpus_per_node": 2, "accelerator": "any"}),
    "gpu-8-bf16": recipe(
        resources={"gpus_per_node": 8, "accelerator": "gpu"}, training={"precision": "bf16"}
    ),
    "gpu-2-fp32-48gb": recipe(
        resources={"gpus_per_node": 2, "accelerator": "gpu", "gpu_memory_gb": 48},
        training={"precision": "fp32"},
    ),
    "script-any-1": {"name": "s", "entrypoint": {"script": "t.py"}, "resources": {"accelerator": "any"}},
}


# The agreement is the explainer's logic against the claim's; 70 pairs per database: PostgreSQL's in the
# slow run.
@pytest.mark.slow_on_postgres
@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("worker", sorted(INVENTORIES))
def test_the_explanation_agrees_with_the_claim(client: TestClient, job: str, worker: str) -> None:
    answer = client.post("/jobs", json=JOBS[job], headers=USER)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    detail = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert detail["waiting"].startswith("no live worker: start one")
    worker_id = register(client, worker, INVENTORIES[worker])
    waiting = client.get(f"/jobs/{job_id}", headers=USER).json()["waiting"]
    claimed = claim(client, worker_id)
    assert (claimed is not None) == waiting.startswith("waiting for free devices"), waiting
    if claimed is None:
        assert waiting.startswith("no live worker fits") and worker in waiting
    else:
        assert client.get(f"/jobs/{job_id}", headers=USER).json()["waiting"] is None


def test_the_reason_names_what_is_missing() -> None:
    needs = Needs(accelerator="gpu", devices=8, min_capability=8.0, gpu_memory_mb=0, script=False)
    cpu = WorkerInventory.model_validate(cpu_inventory(2))
    assert unmet(needs, cpu) == ["the job needs GPUs and this worker has none", "8 CPU slots wanted, 2 here"]
    reason = waiting_reason(needs, [("local-cpu", cpu)])
    assert "needs gpu x 8" in reason and "local-cpu offers cpu x 2" in reason
