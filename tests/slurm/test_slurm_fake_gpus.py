"""GPUs from Slurm's GRES, on the real cluster's node n3 whose two GPUs are FAKE: GRES `gpu:fake:2` backed by
character device files made with mknod (tests/slurm/cluster.py). No GPU exists here, so the job cannot
train on one; what is tested is Slurm's side: the worker offers the GPUs sinfo lists, a GPU recipe is claimed and
asks Slurm for GPUs, and the runner hands the ranks the GPUs Slurm allocated, not the plan's numbers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ..agent.processes import tiny_recipe, wait_until
from ..agent.test_end_to_end import _job, _submit, _wait_status
from .cluster import FAKE_GPU_TYPE, FAKE_GPUS_PER_NODE, GPU_PARTITION, SlurmCluster
from .conftest import slurm_events

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def test_fake_gpus_from_gres_are_offered_asked_for_and_handed_to_the_ranks_as_slurm_allocated_them(
    on_slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    service, worker = on_slurm(partition=GPU_PARTITION, worker_options=("--slurm-gpu-capability", "8.0"))
    api = service.api()
    (offered,) = wait_until(lambda: api.get("/workers").json(), 30, "the Slurm worker registered")
    gpus = offered["inventory"]["gpus"]
    assert [(g["name"], g["compute_capability"], g["memory_mb"]) for g in gpus] == [
        (FAKE_GPU_TYPE, "8.0", 0)
    ] * FAKE_GPUS_PER_NODE, offered["inventory"]
    # GRES says nothing of memory and none was set: a recipe that needs some waits, saying why.
    needs_memory = tiny_recipe(max_steps=4, name="needs-40gb", processes=1)
    needs_memory["resources"].update(accelerator="gpu", gpu_memory_gb=40)
    waiting_id = _submit(api, needs_memory)
    # Someone else's job holds the node's first fake GPU: Slurm gives Flightdeck's job the other one.
    blocker = subprocess.run(
        [
            *("sbatch", "--parsable", "-p", GPU_PARTITION, "--gpus-per-node=1", "-c1", "--output=/dev/null"),
            "--wrap",
            "sleep 120",
        ],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        wait_until(lambda: _slurm_state(slurm_cluster, blocker) == "RUNNING", 30, "the blocker running")
        recipe = tiny_recipe(max_steps=4, name="on-fake-gpus", processes=1)
        recipe["resources"]["accelerator"] = "gpu"
        job_id = _submit(api, recipe, max_attempts=1)
        attempt = wait_until(lambda: (_job(api, job_id)["attempts"] or [None])[0], 60, "the GPU job claimed")
        assert _job(api, job_id)["attempts"][0]["plan"]["devices"] == [0]  # the plan's own numbering
        # Once the job has ended (torch here has no CUDA), plan.json holds the plan as launched.
        _wait_status(api, job_id, {"cancelled", "failed", "succeeded"}, 120)
        record = json.loads((Path(attempt["plan"]["run_dir"]) / "plan.json").read_text())
        launched = {v["name"]: v for v in record["env"]}["CUDA_VISIBLE_DEVICES"]
        # The GPU Slurm allocated (index 1: the blocker holds 0), not the plan's device 0.
        assert launched["value"] == "1" and launched["reason"].endswith("the allocation's instead"), launched
        (slurm_job,) = {e["data"]["slurm_job_id"] for e in slurm_events(api, job_id)}
        shown = _show_job(slurm_cluster, slurm_job)
        assert "TresPerNode=gres:gpu:1" in shown and "NodeList=n3" in shown, shown
        queued = _job(api, waiting_id)
        assert queued["status"] == "queued" and queued["attempts"] == [], queued
        assert "memory is unknown" in queued["waiting"] and "--slurm-gpu-memory-gb" in queued["waiting"], (
            queued
        )
    finally:
        subprocess.run(["scancel", blocker], env=slurm_cluster.env, timeout=30)
    print(worker.log()[-2000:])


def _show_job(cluster: SlurmCluster, job: str) -> str:
    return subprocess.run(
        ["scontrol", "-o", "show", "job", job], env=cluster.env, capture_output=True, text=True, timeout=30
    ).stdout


def _slurm_state(cluster: SlurmCluster, job: str) -> str:
    shown = _show_job(cluster, job)
    return next((t.split("=", 1)[1] for t in shown.split() if t.startswith("JobState=")), "")
