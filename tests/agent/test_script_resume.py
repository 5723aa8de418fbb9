"""A retried script job is told where to resume: `{resume_from}` in its args and FLIGHTDECK_RESUME_FROM.

The real attempt runner, host check and torchrun (one process) run a real script; the service is the
recording stand-in of test_attempt.py. The earlier attempt's checkpoint is laid out as an HF Trainer
in a script leaves it (`{output_dir}/checkpoint-<step>`), marked complete.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from flightdeck.contracts import ClaimedAttempt
from flightdeck.inventory import WorkerInventory
from flightdeck.launch import build_launch_plan
from flightdeck.recipe import parse_recipe
from flightdeck.run_variables import RESUME_VARIABLE
from flightdeck.worker.agent.attempt import AttemptRunner
from flightdeck.worker.checkpoints import mark_complete

from .test_attempt import Service

PROBE = """import json, os, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
with open(os.path.join(out, "probe.json"), "w") as f:
    json.dump({"args": args, "env": os.environ.get("FLIGHTDECK_RESUME_FROM")}, f)
"""


def test_a_retried_script_job_gets_the_checkpoint_in_its_args_and_environment(tmp_path: Path) -> None:
    workspace, runs = tmp_path / "workspace", tmp_path / "runs"
    workspace.mkdir()
    (workspace / "probe.py").write_text(PROBE)
    checkpoint = runs / "db" / "job-4-attempt-1" / "output" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    mark_complete(checkpoint, 2)
    unfinished = runs / "db" / "job-4-attempt-1" / "output" / "checkpoint-3"  # killed mid-save: no marker
    unfinished.mkdir()
    recipe = {
        "name": "probe",
        "entrypoint": {"script": "probe.py", "args": ["--resume", "{resume_from}", "--out", "{run_dir}"]},
        "resources": {"gpus_per_node": 1, "accelerator": "cpu"},
    }
    inventory = WorkerInventory(cpu_slots=1, cores=2, workspace=str(workspace), runs_dir=str(runs))
    plan = build_launch_plan(
        parse_recipe(recipe), inventory, job_id=4, database="db", attempt_number=2, devices=None
    )
    attempt = ClaimedAttempt(
        id=9, job_id=4, number=2, recipe=recipe, plan=plan.model_dump(), lease_seconds=60.0
    )
    service = Service()
    runner = AttemptRunner(
        attempt,
        client=service,
        inventory=inventory,
        stop=threading.Event(),
        ship_interval=0.05,  # type: ignore[arg-type]
    )
    runner.run()

    assert service.finishes[-1]["status"] == "succeeded", service.finishes
    probe = json.loads((Path(plan.run_dir) / "probe.json").read_text())
    assert probe["args"][:2] == ["--resume", str(checkpoint)] and probe["env"] == str(checkpoint)
    launched = json.loads((Path(plan.run_dir) / "plan.json").read_text())  # the plan as run says it too
    assert str(checkpoint) in launched["argv"]
    assert {v["name"]: v["value"] for v in launched["env"]}[RESUME_VARIABLE] == str(checkpoint)
    (partial,) = [e for e in service.events if e.get("code") == "G016"]
    assert partial["data"]["step"] == 3 and "did not finish" in partial["message"]
