"""Hangs named rank by rank, end to end (real service, CPU agent, torchrun with 2 gloo ranks).

A user's script (no Flightdeck import) whose rank 0 evaluates alone while rank 1 waits in a barrier,
stopped: the job names both places. A recipe job whose rank 1 is stopped with SIGSTOP: the service's
stall watch (H003) stops it, and the failure names where each rank was. A recipe job whose launcher
outlives its ranks (as NCCL's destroy_process_group or torchrun's exit barrier can hang after the result):
the agent ends it after the teardown grace, and the job succeeds with H008.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from .processes import FLIGHTDECK, USER_TOKEN, Agent, Service, tiny_recipe, wait_until

pytestmark = pytest.mark.slow

# Written the way a team writes one: plain torch.distributed, evaluation on rank 0 only.
EVAL_ON_RANK_ZERO = '''"""Fine-tune, then evaluate on rank 0 while the other ranks go on to the next collective."""
import time

import torch
import torch.distributed as dist


def evaluate(model):
    print("rank 0: evaluating", flush=True)
    time.sleep(600)  # a long evaluation that only rank 0 runs


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 4)
    if rank == 0:
        evaluate(model)
    print(f"rank {rank}: waiting for the others", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
'''


def _submit(api: httpx.Client, recipe: dict[str, Any]) -> int:
    response = api.post("/jobs", json=recipe, params={"max_attempts": 1})
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _ended(api: httpx.Client, job_id: int, timeout: float) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        job = api.get(f"/jobs/{job_id}").json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(ended, timeout, f"job {job_id} to end")  # type: ignore[no-any-return]


def _log(api: httpx.Client, job_id: int) -> str:
    return str(api.get(f"/jobs/{job_id}/logs", params={"max_bytes": 8 * 1024 * 1024}).json()["text"])


def _show(service: Service, job_id: int) -> str:
    env = {**os.environ, "FLIGHTDECK_URL": service.url, "FLIGHTDECK_TOKEN": USER_TOKEN, "COLUMNS": "400"}
    done = subprocess.run(
        [FLIGHTDECK, "show", str(job_id)], env=env, capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


def test_a_script_whose_rank_0_evaluates_alone_names_both_ranks(cluster: Any, tiny_workspace: Path) -> None:
    script = tiny_workspace / "hangs" / "eval_on_rank0.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(EVAL_ON_RANK_ZERO)
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "hang-script")
    api = service.api()
    recipe = {
        "name": "eval-on-rank-0",
        "entrypoint": {"script": "hangs/eval_on_rank0.py"},
        "resources": {"gpus_per_node": 2, "accelerator": "cpu"},
    }
    job_id = _submit(api, recipe)
    wait_until(
        lambda: "rank 0: evaluating" in (log := _log(api, job_id)) and "rank 1: waiting" in log,
        120,
        f"both ranks in place\n{agent.log()[-2000:]}",
    )
    assert api.post(f"/jobs/{job_id}/cancel").status_code == 202
    job = _ended(api, job_id, 60)
    message = job["failure_message"]
    assert job["status"] == "cancelled", job
    assert "rank 0 in `evaluate()` at hangs/eval_on_rank0.py:10" in message, message
    assert "rank 1 in `barrier` (torch/distributed/" in message, message
    assert "from `main()` at hangs/eval_on_rank0.py:20" in message, message
    events = api.get(f"/jobs/{job_id}/events").json()["events"]
    h006 = [e for e in events if e["code"] == "H006"]
    assert len(h006) == 1 and [r["rank"] for r in h006[0]["data"]["ranks"]] == [0, 1], events
    assert "[flightdeck] stack of rank 1" in _log(api, job_id)  # the whole dumps, stored with the attempt
    shown = _show(service, job_id)
    assert "rank 0 in `evaluate()`" in shown and "rank 1 in `barrier`" in shown, shown


def test_a_recipe_job_with_a_rank_stopped_by_sigstop_fails_with_every_ranks_place(
    cluster: Any,
) -> None:
    # Small stall thresholds so the service's H003 stop comes seconds after the steps stop.
    service: Service = cluster("service", stall_min_seconds=3, stall_warn_min_seconds=1, lease_seconds=6)
    agent: Agent = cluster("agent", service, "hang-recipe")
    api = service.api()
    recipe = tiny_recipe(max_steps=100_000, name="sigstop")
    recipe["health"] = {"stall_factor": 2}
    job_id = _submit(api, recipe)

    def stepping() -> bool:
        points = api.get(f"/jobs/{job_id}/metrics", params={"limit": 100}).json()["points"]
        return len({p["step"] for p in points}) >= 4

    wait_until(stepping, 180, f"job {job_id} to train\n{agent.log()[-2000:]}")
    (torchrun,) = agent.torchrun_pids()
    ranks = {
        int(p.environ()["RANK"]): p for p in psutil.Process(torchrun).children() if "RANK" in p.environ()
    }
    os.kill(ranks[1].pid, signal.SIGSTOP)  # rank 1 freezes; rank 0 waits for it in the next all-reduce
    job = _ended(api, job_id, 120)
    message = job["failure_message"]
    assert job["status"] == "failed" and job["failure_code"] in ("H003", "H006"), job
    assert message.startswith("stalled: no new step"), message
    where = message.split("where the ranks were: ", 1)[1]
    # Rank 1 froze mid-step (usually inside backward, like rank 0 waiting for it): grouped when alike.
    assert where.startswith("ranks 0-1 in `") or ("rank 0 in `" in where and "rank 1 in `" in where), where
    assert ("ranks 0-1" in where) == (job["failure_code"] == "H003"), job
    events = api.get(f"/jobs/{job_id}/events").json()["events"]
    stacks = [e for e in events if e["message"].startswith("where the ranks were when stopped")]
    assert stacks and {r["source"] for r in stacks[0]["data"]["ranks"]} == {"py-spy"}, stacks
    shown = _show(service, job_id)
    assert "where the ranks were" in shown, shown


def test_a_recipe_job_that_hangs_after_its_result_succeeds_with_h008_after_the_grace(cluster: Any) -> None:
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "teardown-recipe")
    api = service.api()
    recipe = tiny_recipe(max_steps=40, name="teardown")
    recipe["health"] = {"teardown_grace_seconds": 3}
    job_id = _submit(api, recipe)

    def both_ranks_set_up() -> bool:
        # Printed once a rank has joined the process group (torchrun's store is no longer needed).
        logs = [p.read_text(errors="replace") for p in agent.runs_dir.rglob("output.log")]
        return any("rank 0: stage 1 dataset" in t and "rank 1: stage 1 dataset" in t for t in logs)

    wait_until(both_ranks_set_up, 180, f"job {job_id}'s ranks to start\n{agent.log()[-2000:]}")
    (torchrun,) = agent.torchrun_pids()
    # The launcher freezes; its ranks train on, write the result and exit: only teardown is left hanging.
    os.kill(torchrun, signal.SIGSTOP)
    job = _ended(api, job_id, 120)
    assert job["status"] == "succeeded" and job["last_step"] == 40, job
    events = api.get(f"/jobs/{job_id}/events").json()["events"]
    h008 = [e for e in events if e.get("code") == "H008"]
    assert len(h008) == 1 and h008[0]["severity"] == "warn", events
    assert h008[0]["message"].startswith(
        "the trainer ended (or was leaving its process group) on every rank"
    ), h008
    assert (
        "still running 3 s later" in h008[0]["message"]
        and "nothing to change in the recipe" in h008[0]["fix"]
    )
    assert job["output_path"], job  # the result the trainer wrote is the attempt's
