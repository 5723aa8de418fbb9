"""Script jobs end to end: the user's own script launched by a real agent under torchrun (2 gloo ranks),
its callback's metrics shipped, its health stop and its crash classified like a recipe job's."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import EXAMPLES
from .processes import Agent, Service, wait_until
from .test_end_to_end import _job, _log_text, _steps, _submit, _wait_status, _why

_DONE = {"succeeded", "failed", "cancelled"}


def _example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / "own-script" / f"{name}.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_an_hf_trainer_script_with_the_callback_runs_to_succeeded_with_its_metrics(cluster: Any) -> None:
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "script-ok")
    api = service.api()
    job_id = _submit(api, _example("callback-job"))
    job = _wait_status(api, job_id, _DONE, 240)
    assert job["status"] == "succeeded", (_why(api, job), agent.log()[-3000:])
    plan = job["attempts"][-1]["plan"]
    assert plan["argv"][plan["argv"].index("--nproc_per_node") + 1] == "2"
    assert plan["argv"][-5].endswith("examples/own-script/train_with_callback.py")
    assert _steps(api, job_id) == list(range(1, 31))  # rank 0's records, one per step
    assert "[flightdeck] stage 1/1 step 30/30" in _log_text(api, job_id)
    assert job["output_path"] == str(Path(plan["run_dir"]) / "output")


@pytest.mark.slow
def test_r1s_script_whose_tower_freezes_itself_fails_in_its_first_steps_with_g002(cluster: Any) -> None:
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "script-r1")
    api = service.api()
    job_id = _submit(api, _example("r1-lazy-tower-job"), max_attempts=1)
    job = _wait_status(api, job_id, _DONE, 240)
    assert (job["status"], job["failure_class"], job["failure_code"]) == ("failed", "health:G002", "G002"), (
        job,
        agent.log()[-3000:],
    )
    assert "vision_tower" in job["failure_message"] and "get_peft_model" in job["failure_fix"]
    assert max(_steps(api, job_id)) == 3


@pytest.mark.slow
def test_a_plain_loop_script_under_ddp_runs_to_succeeded(cluster: Any) -> None:
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "script-loop")
    api = service.api()
    job_id = _submit(api, _example("plain-loop-job"))
    job = _wait_status(api, job_id, _DONE, 240)
    assert job["status"] == "succeeded", (_why(api, job), agent.log()[-3000:])
    assert _steps(api, job_id) == list(range(1, 31))


CRASHES = {
    "P002": "raise RuntimeError('expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16')",
    "E001": "raise RuntimeError('Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
    "multiprocessing, you must use the spawn start method')",
}


@pytest.mark.slow
@pytest.mark.parametrize("code", sorted(CRASHES))
def test_a_script_crashing_with_a_known_error_is_classified_from_its_log(
    code: str, cluster: Any, tiny_workspace: Path
) -> None:
    script = tiny_workspace / "scripts" / f"crash_{code}.py"
    script.parent.mkdir(exist_ok=True)
    # data_parallel.py's frame is where R2's traceback pointed; the code comes from the error text.
    script.write_text(f"def data_parallel_apply():\n    {CRASHES[code]}\n\n\ndata_parallel_apply()\n")
    service: Service = cluster("service")
    cluster("agent", service, f"script-crash-{code}")
    api = service.api()
    recipe = {"name": "crash", "entrypoint": {"script": f"scripts/crash_{code}.py"}}
    job_id = _submit(api, recipe | {"resources": {"gpus_per_node": 2, "accelerator": "cpu"}}, max_attempts=1)
    job = _wait_status(api, job_id, _DONE, 120)
    assert (job["status"], job["failure_code"]) == ("failed", code), job
    assert job["failure_fix"] and "Root Cause" not in job["failure_message"]


@pytest.mark.slow
def test_a_script_outside_the_workspace_or_on_a_no_scripts_worker_never_runs(
    cluster: Any, tiny_workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "evil.py"
    outside.write_text("open('/tmp/flightdeck-evil-ran', 'w').write('ran')\n")
    link = tiny_workspace / "scripts" / "innocent.py"
    link.parent.mkdir(exist_ok=True)
    if not link.is_symlink():
        os.symlink(outside, link)
    service: Service = cluster("service")
    cluster("agent", service, "script-confined")
    api = service.api()
    resources = {"gpus_per_node": 1, "accelerator": "cpu"}
    job_id = _submit(
        api, {"name": "s", "entrypoint": {"script": "scripts/innocent.py"}, "resources": resources}
    )
    job = _wait_status(api, job_id, _DONE, 60)
    assert (job["status"], job["failure_class"], job["failure_code"]) == ("failed", "preflight", "S001"), job
    assert not Path("/tmp/flightdeck-evil-ran").exists()


@pytest.mark.slow
def test_a_worker_started_with_no_scripts_shows_it_and_leaves_script_jobs_queued(cluster: Any) -> None:
    service: Service = cluster("service")
    cluster("agent", service, "no-scripts", scripts=False)
    api = service.api()
    job_id = _submit(api, _example("callback-job"))
    wait_until(lambda: api.get("/workers").json(), 30, "the worker to register")
    time.sleep(6)  # three of its 2-second claim polls
    assert _job(api, job_id)["status"] == "queued"
    (worker,) = api.get("/workers").json()
    assert worker["name"] == "no-scripts" and worker["inventory"]["runs_scripts"] is False
