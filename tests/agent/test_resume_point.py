"""Where a retry resumes: the newest complete checkpoint of its job's earlier attempts (G016 for partial
ones), found in real directories holding real safetensors adapters, as the Trainer and peft lay them out."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from flightdeck.inventory import WorkerInventory
from flightdeck.launch import build_launch_plan
from flightdeck.recipe import parse_recipe
from flightdeck.run_variables import RESUME_VARIABLE
from flightdeck.worker.agent.environment import launch_environment
from flightdeck.worker.agent.process import AttemptProcess
from flightdeck.worker.agent.resume import fill_resume_place, resolve_resume
from flightdeck.worker.checkpoints import MARKER_FILE, find_resume_point, incomplete_because, mark_complete


def _checkpoint(run_dir: Path, step: int, *, stage: int = 0, complete: bool = True) -> Path:
    """A LoRA checkpoint as the Trainer writes one (adapter, optimizer, scheduler, RNG, trainer state)."""
    path = run_dir / "output" / f"stage-{stage}" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    save_file(
        {"base_model.model.layers.0.q_proj.lora_A.weight": torch.ones(8, 64) * step},
        str(path / "adapter_model.safetensors"),
    )
    torch.save({"state": {}, "param_groups": []}, path / "optimizer.pt")
    torch.save({"last_epoch": step}, path / "scheduler.pt")
    torch.save({"python": None}, path / "rng_state_0.pth")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if complete:
        mark_complete(path, step)
    return path


def test_a_retry_takes_the_newest_complete_checkpoint_and_skips_partial_ones_with_g016(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "job-5-attempt-1", tmp_path / "job-5-attempt-2"
    _checkpoint(first, 4)
    newest_complete = _checkpoint(second, 8)  # attempt 2 resumed from 4 and saved 8 before it was lost
    killed_mid_save = _checkpoint(second, 12, complete=False)
    truncated = _checkpoint(second, 10)
    (truncated / "optimizer.pt").write_bytes(b"\0")  # rewritten after the marker: no longer what was saved
    _checkpoint(tmp_path / "job-6-attempt-1", 50)  # another job's: never taken
    _checkpoint(tmp_path / "job-5-attempt-2-node-1", 60)  # node 1's directory: rank 0 saves on node 0

    resume = resolve_resume(tmp_path / "job-5-attempt-3", attempt_number=3)

    assert resume.path == str(newest_complete)
    partial = [e for e in resume.events if e["code"] == "G016"]
    assert [(e["severity"], e["data"]["step"]) for e in partial] == [("warn", 12), ("warn", 10)]
    assert (
        f"no {MARKER_FILE}" in partial[0]["message"]
        and str(killed_mid_save) == partial[0]["data"]["checkpoint"]
    )
    assert "optimizer.pt has 1 bytes" in partial[1]["message"]
    (chosen,) = [e for e in resume.events if e["key"] == "resume:from"]
    assert chosen["data"] == {"checkpoint": str(newest_complete), "step": 8, "attempt": 2}
    assert "the first step is 9" in chosen["message"]


def test_an_adapter_saved_empty_or_unreadable_is_not_a_checkpoint(tmp_path: Path) -> None:
    empty = _checkpoint(tmp_path / "job-1-attempt-1", 3, complete=False)
    save_file({"lora_A.weight": torch.ones(0, 64)}, str(empty / "adapter_model.safetensors"))  # ZeRO-3 style
    mark_complete(empty, 3)
    assert incomplete_because(empty) == "1 of the adapter's 1 tensors are empty (0-sized)"
    garbage = _checkpoint(tmp_path / "job-1-attempt-1", 2, complete=False)
    (garbage / "adapter_model.safetensors").write_bytes(b"not safetensors")
    mark_complete(garbage, 2)
    assert "adapter_model.safetensors unreadable" in str(incomplete_because(garbage))
    assert find_resume_point(tmp_path / "job-1-attempt-2").found is None


def test_a_first_attempt_looks_for_nothing_and_a_retry_without_checkpoints_starts_from_zero(
    tmp_path: Path,
) -> None:
    _checkpoint(tmp_path / "job-2-attempt-1", 5)
    assert resolve_resume(tmp_path / "job-2-attempt-1", attempt_number=1).events == []
    empty = resolve_resume(tmp_path / "job-9-attempt-2", attempt_number=2)
    assert empty.path == "" and "starts from step 0" in empty.events[0]["message"]


def test_a_retrys_plan_leaves_the_resume_point_to_the_host_and_a_scripts_args_get_it(tmp_path: Path) -> None:
    recipe = parse_recipe(
        {
            "name": "script",
            "entrypoint": {
                "script": "train.py",
                "args": ["--resume", "{resume_from}", "--out", "{output_dir}"],
            },
            "resources": {"gpus_per_node": 1, "accelerator": "cpu"},
        }
    )
    inventory = WorkerInventory(
        cpu_slots=1, cores=2, workspace=str(tmp_path), runs_dir=str(tmp_path / "runs")
    )
    first = build_launch_plan(recipe, inventory, job_id=3, database="db", attempt_number=1, devices=None)
    retry = build_launch_plan(recipe, inventory, job_id=3, database="db", attempt_number=2, devices=None)
    assert first.env_value(RESUME_VARIABLE) is None and RESUME_VARIABLE not in {v.name for v in first.env}
    (planned,) = [v for v in retry.env if v.name == RESUME_VARIABLE]
    assert planned.value is None and "found by the runner on the host" in planned.reason
    assert retry.argv[-3] == "{resume_from}"  # the service cannot know it: left for the runner
    env, _ = launch_environment(
        retry, {}, port=29500, resume_from="/runs/job-3-attempt-1/output/checkpoint-4"
    )
    assert env[RESUME_VARIABLE] == "/runs/job-3-attempt-1/output/checkpoint-4"
    argv = fill_resume_place(retry.argv, env[RESUME_VARIABLE])
    assert argv[-4:] == ["--resume", "/runs/job-3-attempt-1/output/checkpoint-4", "--out", argv[-1]]
    assert fill_resume_place(retry.argv, "")[-3] == ""


def test_a_launch_starts_with_sigusr1_ignored_so_a_schedulers_warning_cannot_end_torchrun(
    tmp_path: Path,
) -> None:
    """A scheduler that signals every process of a job (Slurm's --signal=USR1@N without B:, set by a
    user's own --slurm-option) must not end torchrun (not ours); the trainer installs its own handler
    over the inherited SIG_IGN."""
    probe = "import signal; print('usr1 ignored:', signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)"
    process = AttemptProcess([sys.executable, "-c", probe], dict(os.environ), str(tmp_path), tmp_path / "log")
    assert process.popen.wait(timeout=30) == 0
    process.stop(1.0)
    assert "usr1 ignored: True" in (tmp_path / "log").read_text()
