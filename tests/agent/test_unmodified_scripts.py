"""Users' scripts as they are, run as script jobs by a real service and agent under torchrun (2 gloo ranks).

No script here imports Flightdeck: TRL's own SFT script is copied unmodified from the installed trl
package; `user_scripts/` holds scripts shaped like teams' own (an HF Trainer script, a pytorch/examples
style DDP loop). Each planted failure ends with its code; the healthy variants succeed with no warning.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from .processes import Agent, Service
from .test_end_to_end import _log_text, _steps, _submit, _wait_status, _why

pytestmark = pytest.mark.slow

_DONE = {"succeeded", "failed", "cancelled"}
USER_SCRIPTS = Path(__file__).resolve().parent / "user_scripts"


@pytest.fixture(scope="module")
def scripts(tiny_workspace: Path) -> Path:
    """TRL's sft.py as the trl package ships it, the user scripts, and the data they read, in the workspace."""
    import random

    import trl

    target = tiny_workspace / "user"
    target.mkdir(exist_ok=True)
    shutil.copy(Path(trl.__file__).parent / "scripts" / "sft.py", target / "sft.py")
    for script in USER_SCRIPTS.glob("*.py"):
        shutil.copy(script, target / script.name)
    rng = random.Random(0)
    (target / "sft-data").mkdir(exist_ok=True)
    with open(target / "sft-data" / "train.jsonl", "w") as out:
        for _ in range(200):
            a, b = rng.randint(0, 50), rng.randint(0, 50)
            out.write(json.dumps({"text": f"{a} plus {b} is {a + b}."}) + "\n")
    with open(target / "qa.jsonl", "w") as out:
        for _ in range(200):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            out.write(json.dumps({"question": f"what is {a} plus {b}?", "answer": str(a + b)}) + "\n")
    return target


def _job(script: str, args: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "name": script,
        "entrypoint": {"script": f"user/{script}", "args": args},
        "resources": {"gpus_per_node": 2, "accelerator": "cpu"},
        **extra,
    }


def _sft(*more: str) -> dict[str, Any]:
    # What a user passes to TRL's script, the arguments it takes on GPUs too: no --use_cpu and no
    # --ddp_backend, although this worker has no GPU (the plan's ACCELERATE_USE_CPU makes them one DDP job).
    args = [
        "--model_name_or_path", "{workspace}/models/tiny-llama",
        "--dataset_name", "{workspace}/user/sft-data",
        "--output_dir", "{output_dir}",
        "--max_steps", "8", "--logging_steps", "1", "--per_device_train_batch_size", "2",
        "--bf16", "false", "--report_to", "none",
        "--disable_tqdm", "true", "--save_strategy", "no",
        *more,
    ]  # fmt: skip
    return _job("sft.py", args)


def _events(api: httpx.Client, job_id: int) -> list[dict[str, Any]]:
    response = api.get(f"/jobs/{job_id}/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["events"] if isinstance(body, dict) else body  # type: ignore[no-any-return]


def _warnings(api: httpx.Client, job_id: int) -> list[str]:
    return [
        f"{e.get('code')}: {e['message']}"
        for e in _events(api, job_id)
        if e.get("severity") in ("warn", "fatal")
    ]


def _run(api: httpx.Client, recipe: dict[str, Any], timeout: float = 300) -> tuple[int, dict[str, Any]]:
    job_id = _submit(api, recipe, max_attempts=1)
    return job_id, _wait_status(api, job_id, _DONE, timeout)


def test_trls_own_sft_script_reports_every_step_and_a_huge_learning_rate_is_h007(
    cluster: Any, scripts: Path
) -> None:
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "trl")
    api = service.api()

    job_id, job = _run(api, _sft())
    assert job["status"] == "succeeded", (_why(api, job), agent.log()[-2000:])
    points = api.get(f"/jobs/{job_id}/metrics", params={"limit": 100}).json()["points"]
    assert [p["step"] for p in points] == list(
        range(1, 9)
    )  # FlightdeckCallback, put in by the launch: no edit
    assert all("trainable_params" in p["values"] and "parsed_from_log" not in p["values"] for p in points)
    assert _warnings(api, job_id) == []
    # One job of 2 ranks, not 2 copies each training alone on all 200 rows as process 0: the ranks share
    # an epoch (50 steps of 2 rows on each), and one of them reported.
    assert points[-1]["values"]["epoch"] == pytest.approx(8 / 50), points[-1]
    started = [e["message"] for e in _events(api, job_id) if e["message"].startswith("training started")]
    assert len(started) == 1, started
    run_dir = Path(job["attempts"][-1]["plan"]["run_dir"])
    assert (run_dir / "output" / "config.json").is_file()  # {output_dir}, and the script ran there

    # Instrumentation off: the last resort parses the Trainer's own log lines, marked as parsed.
    bare = _sft()
    bare["entrypoint"]["instrument"] = False
    job_id, job = _run(api, bare)
    assert job["status"] == "succeeded", _why(api, job)
    points = api.get(f"/jobs/{job_id}/metrics", params={"limit": 100}).json()["points"]
    assert [p["step"] for p in points] == list(range(1, 9))
    assert {p["values"].get("parsed_from_log") for p in points} == {1.0}, points[0]

    job_id, job = _run(api, _sft("--learning_rate", "1e4"))
    assert (job["status"], job["failure_class"], job["failure_code"]) == ("failed", "health:H007", "H007"), (
        _why(api, job)
    )
    assert "--learning_rate" in job["failure_fix"]
    assert max(_steps(api, job_id)) == 3  # grad norm exactly 0 from step 2, patience 2


def test_an_hf_trainer_script_whose_labels_are_all_masked_fails_with_d005(
    cluster: Any, scripts: Path
) -> None:
    service: Service = cluster("service")
    cluster("agent", service, "qa")
    api = service.api()
    args = [
        "--model_name_or_path", "{workspace}/models/tiny-llama", "--train_file", "{workspace}/user/qa.jsonl",
        "--output_dir", "{output_dir}", "--max_steps", "10", "--logging_steps", "1",
        "--per_device_train_batch_size", "4", "--use_cpu", "--ddp_backend", "gloo", "--report_to", "none",
        "--disable_tqdm", "true", "--save_strategy", "no",
    ]  # fmt: skip
    # A maximum length shorter than the prompt: every answer token is cut away, every label is -100.
    job_id, job = _run(api, _job("train_qa.py", [*args, "--max_seq_length", "5"]))
    assert (job["status"], job["failure_class"], job["failure_code"]) == ("failed", "health:D005", "D005"), (
        _why(api, job)
    )
    assert max(_steps(api, job_id)) == 2


def test_a_plain_ddp_loop_is_watched_at_its_optimizer_and_its_zero_loss_bug_is_d005(
    cluster: Any, scripts: Path
) -> None:
    service: Service = cluster("service")
    cluster("agent", service, "loop")
    api = service.api()

    job_id, job = _run(api, _job("ddp_loop.py", ["--total_epochs", "2"]))
    assert job["status"] == "succeeded", _why(api, job)
    assert _steps(api, job_id) == list(range(1, 21))  # 160 samples / 2 ranks / batch 8, 2 epochs
    assert _warnings(api, job_id) == []
    # The same script again: its own directory, so no snapshot.pt of the first run to resume from.
    job_id, job = _run(api, _job("ddp_loop.py", ["--total_epochs", "2"]))
    assert job["status"] == "succeeded", _why(api, job)
    assert "Resuming training from snapshot" not in _log_text(api, job_id)
    assert _steps(api, job_id) == list(range(1, 21))

    job_id, job = _run(api, _job("ddp_loop.py", ["--zero_loss"]))
    assert (job["status"], job["failure_class"], job["failure_code"]) == ("failed", "health:D005", "D005"), (
        _why(api, job)
    )
    assert max(_steps(api, job_id)) == 2


def test_a_script_that_ended_but_hangs_at_exit_succeeds_with_h008_and_a_mid_run_hang_is_h003(
    cluster: Any, scripts: Path
) -> None:
    service: Service = cluster("service", stall_min_seconds=4, stall_warn_min_seconds=1)
    cluster("agent", service, "hang")
    api = service.api()

    hang_at_exit = _job(
        "ddp_loop.py", ["--total_epochs", "2", "--hang_at_exit"], health={"teardown_grace_seconds": 3}
    )
    job_id, job = _run(api, hang_at_exit, timeout=120)
    assert job["status"] == "succeeded", _why(api, job)
    warnings = _warnings(api, job_id)
    assert len(warnings) == 1 and warnings[0].startswith("H008: ") and "rank 1 (pid" in warnings[0], warnings
    assert "waiting in" in warnings[0]  # the rank's stack, dumped before it was ended
    assert "H003" not in json.dumps(_events(api, job_id))

    # Bare (no markers, no metrics live): rank 0 exiting says the script ended; rank 1 idle is ended.
    bare = _job(
        "ddp_loop.py", ["--total_epochs", "2", "--hang_at_exit"], health={"teardown_grace_seconds": 3}
    )
    bare["entrypoint"]["instrument"] = False
    job_id, job = _run(api, bare, timeout=120)
    assert job["status"] == "succeeded", _why(api, job)
    warnings = _warnings(api, job_id)
    assert len(warnings) == 1 and warnings[0].startswith("H008: rank 0 exited, and rank 1 used no CPU"), (
        warnings
    )

    job_id, job = _run(api, _job("ddp_loop.py", ["--hang_at_step", "5"]), timeout=120)
    assert (job["status"], job["failure_code"]) == ("failed", "H003"), _why(api, job)


def test_a_cuda_only_script_on_a_cpu_worker_is_warned_about_before_launch_and_fails_with_e007(
    cluster: Any, scripts: Path, tiny_workspace: Path
) -> None:
    service: Service = cluster("service")
    cluster("agent", service, "cuda")
    api = service.api()
    source = (scripts / "ddp_loop.py").read_text()
    # The pytorch/examples original: NCCL and a GPU per rank, hard-coded.
    cuda_only = source.replace(
        'init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")',
        'init_process_group(backend="nccl")\n    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))',
    )
    assert cuda_only != source
    (scripts / "ddp_loop_gpu.py").write_text(cuda_only)
    job_id, job = _run(api, _job("ddp_loop_gpu.py", []))
    assert (job["status"], job["failure_code"]) == ("failed", "E007"), _why(api, job)
    assert "no GPU" in job["failure_fix"]
    host = [e for e in _events(api, job_id) if e.get("code") == "E007" and e.get("severity") == "warn"]
    assert host and "set_device" in host[0]["message"], _events(api, job_id)
