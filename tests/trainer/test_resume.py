"""SIGUSR1 makes the trainer save a checkpoint at the next step and stop (G017), where a retry finds it.

Real torchrun with two gloo ranks on the tiny LoRA recipe; the signal goes to rank 1 only, as a
scheduler's signal may reach one process first: both ranks must stop at the same step.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from flightdeck.contracts import CHECKPOINT_STOP_EXIT_CODE
from flightdeck.worker.checkpoints import find_resume_point, incomplete_because
from flightdeck.worker.train.metrics_file import read_metrics

from .conftest import _SCRUB, REPO

pytestmark = pytest.mark.slow


def _start(run_dir: Path, recipe: dict[str, Any], workspace: Path, **extra: str) -> subprocess.Popen[str]:
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(json.dumps(recipe))
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env |= {"FLIGHTDECK_WORKSPACE": str(workspace), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return subprocess.Popen(
        [*argv, "-m", "flightdeck.worker.train", str(run_dir / "recipe.json")],
        cwd=REPO,
        env=env,
        stdout=open(run_dir / "output.log", "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "step"]


def _rank(torchrun: subprocess.Popen[str], rank: str) -> psutil.Process:
    for child in psutil.Process(torchrun.pid).children(recursive=True):
        try:
            if "flightdeck.worker.train" in child.cmdline() and child.environ().get("RANK") == rank:
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no rank {rank} under torchrun {torchrun.pid}")


def _kill_tree(torchrun: subprocess.Popen[str]) -> None:
    """torchrun and its ranks (each in a session of its own), if a failed wait left them running."""
    if torchrun.poll() is None:
        for process in [*psutil.Process(torchrun.pid).children(recursive=True), psutil.Process(torchrun.pid)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        torchrun.wait(timeout=30)


def test_sigusr1_to_one_rank_saves_a_complete_checkpoint_on_every_rank_and_stops_with_g017(
    make_recipe: Any, workspace: Path, tmp_path: Path
) -> None:
    recipe = make_recipe(training={"max_steps": 200, "save_steps": 1000})  # checkpoints on, none due
    first = tmp_path / "job-7-attempt-1"
    torchrun = _start(first, recipe, workspace)
    try:
        deadline = time.monotonic() + 150
        while len(_steps(first)) < 3:
            assert torchrun.poll() is None and time.monotonic() < deadline, (first / "output.log").read_text()
            time.sleep(0.2)
        _rank(torchrun, "1").send_signal(psutil.signal.SIGUSR1)  # one rank: the other must agree
        code = torchrun.wait(timeout=90)
    finally:
        _kill_tree(torchrun)
    log = (first / "output.log").read_text()
    result = json.loads((first / "result.json").read_text())
    stopped_at = _steps(first)[-1]["step"]
    assert code != 0 and f"exitcode  : {CHECKPOINT_STOP_EXIT_CODE}" in log.replace(
        "exitcode: ", "exitcode  : "
    ), log
    assert result["failure_code"] == "G017", result
    assert f"checkpoint-{stopped_at}" in result["message"] and stopped_at < 200
    checkpoint = first / "output" / "stage-0" / f"checkpoint-{stopped_at}"
    assert incomplete_because(checkpoint) is None  # marked complete after every rank's files
    assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}

    # What a retry would resume from (its resume itself: tests/reliability/test_faults.py, the
    # killed-agent test, where the retry's first step is the checkpoint's + 1 and the loss is the same).
    found = find_resume_point(tmp_path / "job-7-attempt-2").found
    assert found is not None and (found.path, found.step) == (checkpoint, stopped_at)
