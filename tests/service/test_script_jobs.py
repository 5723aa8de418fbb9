"""Script jobs (recipe `entrypoint`): what the service accepts, how it plans them, who may claim them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flightdeck.inventory import WorkerInventory
from flightdeck.launch.plan import build_launch_plan
from flightdeck.preflight import run_static_preflight
from flightdeck.recipe import RecipeInvalid, parse_recipe
from flightdeck.service.jobs import requirements
from tests.service.factories import USER, WORKER, cpu_inventory, gpu_inventory, recipe
from tests.service.test_worker_api import claim, register

SCRIPT = {"script": "scripts/train_shirg.py", "args": ["--epochs", "1", "--name", "a b; rm -rf /"]}


def script_job(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "own",
        "entrypoint": SCRIPT,
        "resources": {"gpus_per_node": 2, "accelerator": "any"},
    } | overrides


def _paths(payload: Any) -> dict[str, str]:
    with pytest.raises(RecipeInvalid) as refused:
        parse_recipe(payload)
    return {f.path: f.message for f in refused.value.findings}


def test_a_script_job_needs_no_model_data_adapter_or_training() -> None:
    parsed = parse_recipe(script_job())
    assert parsed.is_script and parsed.model is None and parsed.data is None
    # The trainer's defaults (a LoRA adapter, bf16) would be judged by preflight as if the script used them.
    assert parsed.adapter is None and parsed.training is None
    needs = requirements(parsed)
    assert needs["req_script"] is True and needs["req_min_capability"] == 0.0


def test_a_recipe_job_still_needs_model_and_data() -> None:
    paths = _paths({"name": "x"})
    assert set(paths) == {"model", "data"}
    assert "entrypoint" in paths["model"]


@pytest.mark.parametrize(
    ("entrypoint", "path"),
    [
        ({"script": "/etc/passwd"}, "entrypoint.script"),
        ({"script": "../outside.py"}, "entrypoint.script"),
        ({"script": "ok/../../outside.py"}, "entrypoint.script"),
        ({"module": "os; import x"}, "entrypoint.module"),
        ({"script": "a.py", "module": "a"}, "entrypoint"),
        ({}, "entrypoint"),
        ({"script": "a.py", "args": "--epochs 1"}, "entrypoint.args"),
        ({"script": "a.py", "args": ["ok", "nul\x00byte"]}, "entrypoint.args[1]"),
        ({"script": ".venv/bin/torchrun"}, "entrypoint.script"),
        ({"script": "a.py", "shell": "bash"}, "entrypoint.shell"),
    ],
)
def test_bad_entrypoints_are_refused_at_their_path(entrypoint: dict[str, Any], path: str) -> None:
    assert path in _paths(script_job(entrypoint=entrypoint))


def test_a_script_job_has_no_stages() -> None:
    paths = _paths(script_job(stages=[{"health": {"zero_grad_patience": 3}}]))
    assert "stages" in paths and "inside the script" in paths["stages"]


def test_static_preflight_runs_the_launch_rules_and_the_rules_for_what_the_job_declares() -> None:
    bare = run_static_preflight(parse_recipe(script_job()))
    assert [f.code for f in bare.findings] == ["E004"]  # the environment fix applies to any launch
    declared = run_static_preflight(
        parse_recipe(
            script_job(model={"path": "m", "device_map": "auto"}, data={"train": [{"path": "d.jsonl"}]})
        )
    )
    # Declared for preflight only: a device map is one process over the node's GPUs (P002 applies).
    assert "P002" in {f.code for f in declared.findings}
    assert declared.effective.processes_per_node == 1


def test_the_plan_runs_the_script_from_the_workspace_with_its_argv_untouched() -> None:
    parsed = parse_recipe(script_job())
    inventory = WorkerInventory.model_validate(cpu_inventory(2))
    plan = build_launch_plan(parsed, inventory, job_id=7, database="db", attempt_number=1, devices=None)
    program = plan.argv[plan.argv.index("/ws/scripts/train_shirg.py") :]
    assert program == ["/ws/scripts/train_shirg.py", "--epochs", "1", "--name", "a b; rm -rf /"]
    assert "flightdeck.worker.train" not in plan.argv
    assert plan.env_value("FLIGHTDECK_RUN_DIR") == plan.run_dir
    assert plan.env_value("SHIRG_NO_DEVICE_MAP") == "1"
    module = parse_recipe(script_job(entrypoint={"module": "team.train", "args": ["-x"]}))
    argv = build_launch_plan(module, inventory, job_id=7, database="db", attempt_number=1, devices=None).argv
    assert argv[-3:] == ["-m", "team.train", "-x"]


def test_a_worker_started_with_no_scripts_never_claims_a_script_job(client: TestClient) -> None:
    script = client.post("/jobs", json=script_job(), headers=USER)
    assert script.status_code == 201, script.text
    plain = client.post("/jobs", json=recipe(), headers=USER).json()["id"]
    careful = register(client, "careful", cpu_inventory(2) | {"runs_scripts": False})
    assert claim(client, careful)["job_id"] == plain  # type: ignore[index]  # the script job is skipped
    assert claim(client, careful) is None
    listed = {w["name"]: w["inventory"]["runs_scripts"] for w in client.get("/workers", headers=USER).json()}
    assert listed == {"careful": False}
    trusting = register(client, "trusting", gpu_inventory(2))
    attempt = claim(client, trusting)
    assert attempt is not None and attempt["job_id"] == script.json()["id"]
    assert "/ws/scripts/train_shirg.py" in attempt["plan"]["argv"]  # type: ignore[index]


def test_preflight_shows_a_script_jobs_launch_plan_without_a_described_worker(client: TestClient) -> None:
    answer = client.post("/preflight", json=script_job(), headers=USER)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["ok"] and "notional worker" in body["plan_on"]
    assert body["plan"]["argv"][-5:] == ["scripts/train_shirg.py", "--epochs", "1", "--name", "a b; rm -rf /"]
    assert "does not declare model, data, training" in body["memory"]


def test_worker_routes_refuse_nothing_new_for_old_workers(client: TestClient) -> None:
    # An inventory without runs_scripts (an older agent) registers as running scripts, as before.
    assert (
        client.post(
            "/workers", json={"name": "old", "inventory": cpu_inventory()}, headers=WORKER
        ).status_code
        == 201
    )


@pytest.mark.parametrize(
    "job",
    [
        recipe(env={"OMP_NUM_THREADS": "64"}, resources={"gpus_per_node": 2, "accelerator": "gpu"}),
        script_job(resources={"gpus_per_node": 2, "accelerator": "gpu"}),
    ],
    ids=["recipe-job", "script-job"],
)
def test_the_plan_a_dry_run_previews_is_the_plan_the_claim_runs(
    client: TestClient, job: dict[str, Any]
) -> None:
    rtx = gpu_inventory(2, name="NVIDIA GeForce RTX 4090", capability="8.9")
    preview = client.post("/preflight", json={"recipe": job, "host": rtx}, headers=USER).json()
    job_id = client.post("/jobs", json=job, headers=USER).json()["id"]
    claimed = claim(client, register(client, "rtx-box", rtx))
    assert claimed is not None
    # A preview is of no job and no database (job 0 under preview/); the claim's, of this database's job.
    database = client.app.state.flightdeck.db.database_id  # type: ignore[attr-defined]
    previewed = json.dumps(preview["plan"], sort_keys=True).replace(
        "preview/job-0-attempt-1", f"{database}/job-{job_id}-attempt-1"
    )
    assert previewed == json.dumps(claimed["plan"], sort_keys=True)
    # The worker-specific corrections are the plan's, shown in the preview as findings.
    expected = {"E005"} if "entrypoint" in job else {"E003", "E005"}
    assert expected <= {f["code"] for f in preview["findings"]}
