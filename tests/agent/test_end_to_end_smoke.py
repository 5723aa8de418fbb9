"""The one real end-to-end job of the default test run (the rest of the end-to-end runs are `slow`):
a uvicorn service, a CPU agent, torchrun with 2 gloo ranks training LoRA, metrics and logs shipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .processes import Agent, Service, tiny_recipe
from .test_end_to_end import _gone, _log_text, _steps, _submit, _wait_status


def test_job_runs_to_success_with_plan_metrics_and_logs(cluster: Any) -> None:
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "e2e-ok")
    api = service.api()
    job_id = _submit(api, tiny_recipe(max_steps=6))
    job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 240)
    assert job["status"] == "succeeded", (job, agent.log()[-3000:])

    attempt = job["attempts"][-1]
    plan = attempt["plan"]
    assert plan["argv"][plan["argv"].index("--nproc_per_node") + 1] == "2"
    assert plan["argv"][-2:] == ["flightdeck.worker.train", f"{plan['run_dir']}/recipe.json"]
    env = {var["name"]: var for var in plan["env"]}
    assert env["FLIGHTDECK_BACKEND"]["value"] == "gloo" and env["OMP_NUM_THREADS"]["reason"]

    assert _steps(api, job_id) == [1, 2, 3, 4, 5, 6]
    run_dir = Path(plan["run_dir"])
    log = _log_text(api, job_id)
    assert log == (run_dir / "output.log").read_bytes().decode(errors="replace")
    # Known harmless library warnings do not open every rank's log (worker/log_noise.py).
    assert "kernels-community" not in log and "is_gradient_checkpointing" not in log, log[:2000]
    launched = json.loads((run_dir / "plan.json").read_text())
    port = next(var["value"] for var in launched["env"] if var["name"] == "MASTER_PORT")
    assert port and port.isdigit()  # the agent resolved the free port (E002)
    assert job["output_path"] and Path(job["output_path"]).is_dir()
    assert all(_gone(pid) for pid in agent.torchrun_pids())
