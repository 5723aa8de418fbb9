"""Every recipe in examples/ runs to `succeeded` through a real service and a CPU agent (a promise).

R1 and R2 are vision-language set-ups (tiny LLaVA-SigLIP under 2-process DDP; tiny Qwen2-VL, two
stages, the second in 4-bit): their metrics must arrive and the loss must come down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .processes import Agent, Service
from .test_end_to_end import _job, _submit, _wait_status

pytestmark = pytest.mark.slow
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.json"))


def _losses(api: Any, job_id: int) -> list[float]:
    response = api.get(f"/jobs/{job_id}/metrics", params={"limit": 10_000})
    assert response.status_code == 200, response.text
    points = response.json()["points"]
    return [p["values"]["loss"] for p in points if isinstance(p["values"].get("loss"), float)]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_to_succeeded(path: Path, cluster: Any) -> None:
    service: Service = cluster("service")
    recipe = json.loads(path.read_text())
    nodes = recipe["resources"].get("nodes", 1)
    # A multi-node example runs over as many agents, one node each (one CPU slot per node).
    agents: list[Agent] = [
        cluster("agent", service, f"examples-{path.stem}-{rank}", **({"slots": 1} if nodes > 1 else {}))
        for rank in range(nodes)
    ]
    agent = agents[0]
    api = service.api()
    job_id = _submit(api, recipe)
    job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 300)
    assert job["status"] == "succeeded", (job.get("failure"), agent.log()[-4000:])
    losses = _losses(api, job_id)
    assert losses, "no metric arrived"
    if recipe["task"] == "vision_language":
        # Each stage starts from a higher loss than it ends with (averaged over a few steps: tiny batches).
        assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
        effective = _job(api, job_id)["effective_recipe"]
        assert effective["task"] == "vision_language"
