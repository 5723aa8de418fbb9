"""Every rank's stack, named (H006): py-spy on real processes (running and SIGSTOPped), the trainer's
faulthandler dumps, the summary, and the NCCL Flight Recorder variables of GPU plans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flightdeck.inventory import GpuInfo, WorkerInventory
from flightdeck.launch import build_launch_plan
from flightdeck.recipe import parse_recipe
from flightdeck.worker.agent.rank_stacks import (
    parse_faulthandler,
    ranks_apart,
    stacks_left_on_disk,
    summarize,
    take_rank_stacks,
)

# A user's file: rank 0 "evaluates" (sleeps), rank 1 waits (sleeps in another function here: a real
# barrier needs two processes, tests/agent/test_hang_stacks.py has that).
USER_SCRIPT = """
import os, sys, time
from pathlib import Path
def evaluate():
    time.sleep(60)
def wait_for_peers():
    time.sleep(60)
def main():
    Path(sys.argv[1]).touch()
    if os.environ["RANK"] == "0":
        evaluate()
    else:
        wait_for_peers()
main()
"""


def _launch(tmp_path: Path, rank: int) -> subprocess.Popen[bytes]:
    script = tmp_path / "eval_hang.py"
    script.write_text(USER_SCRIPT)
    ready = tmp_path / f"ready-{rank}"
    env = {**os.environ, "RANK": str(rank)}
    proc = subprocess.Popen([sys.executable, str(script), str(ready)], env=env, cwd=tmp_path)
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # The file exists once `touch` opened it; a rank stopped before `touch` returned would be read in
    # `touch`, not where it waits. Asleep means inside the function's time.sleep.
    while psutil.Process(proc.pid).status() != psutil.STATUS_SLEEPING and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def test_py_spy_names_each_rank_even_one_stopped_with_sigstop(tmp_path: Path) -> None:
    ranks = [_launch(tmp_path, 0), _launch(tmp_path, 1)]
    try:
        os.kill(ranks[1].pid, signal.SIGSTOP)  # a stopped rank cannot be suspended: read without
        stacks = take_rank_stacks([psutil.Process(p.pid) for p in ranks], tmp_path)
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    assert [(s.rank, s.source) for s in stacks] == [(0, "py-spy"), (1, "py-spy")]
    summary = summarize(stacks, str(tmp_path))
    assert summary == (
        "rank 0 in `evaluate()` at eval_hang.py:5; rank 1 in `wait_for_peers()` at eval_hang.py:7"
    ), summary
    assert ranks_apart(stacks, str(tmp_path))


WITH_LOADER_WORKER = """
import subprocess, sys, time
from pathlib import Path
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # inherits RANK
Path(sys.argv[1]).write_text(str(worker.pid))
time.sleep(60)
"""


def test_a_loader_worker_is_not_a_rank(tmp_path: Path) -> None:
    """A rank's child (a DataLoader worker) inherits RANK: only the process whose parent has none is a rank."""
    script, ready = tmp_path / "loader.py", tmp_path / "worker-pid"
    script.write_text(WITH_LOADER_WORKER)
    rank = subprocess.Popen([sys.executable, str(script), str(ready)], env={**os.environ, "RANK": "3"})
    try:
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = psutil.Process(int(ready.read_text()))
        assert worker.environ()["RANK"] == "3"
        for order in ([worker, psutil.Process(rank.pid)], [psutil.Process(rank.pid), worker]):
            stacks = take_rank_stacks(order, tmp_path)
            assert [(s.rank, s.pid) for s in stacks] == [(3, rank.pid)]
    finally:
        for proc in psutil.Process(rank.pid).children():
            proc.kill()
        rank.kill()
        rank.wait()


FAULTHANDLER_DUMP = """Thread 0x00007f2b8c9ff640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 995 in _bootstrap

Current thread 0x00007f2b9a1b4740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4811 in barrier
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/ws/train.py", line 40 in main
  File "/ws/train.py", line 52 in <module>
"""


def test_faulthandler_dumps_left_on_disk_name_the_rank_and_its_collective(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "rank-1.txt").write_text(FAULTHANDLER_DUMP)
    (tmp_path / "stacks" / "rank-0.txt").write_text("")  # registered, never signalled: nothing to say
    stacks = stacks_left_on_disk(tmp_path)
    assert [s.rank for s in stacks] == [1]
    assert [f.function for f in parse_faulthandler(FAULTHANDLER_DUMP)][:3] == ["barrier", "wrapper", "main"]
    assert summarize(stacks, "/ws") == (
        "rank 1 in `barrier` (torch/distributed/distributed_c10d.py:4811) from `main()` at train.py:40"
    )


def test_ranks_in_one_place_are_grouped_and_not_apart(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    for rank in range(3):
        (tmp_path / "stacks" / f"rank-{rank}.txt").write_text(FAULTHANDLER_DUMP)
    stacks = stacks_left_on_disk(tmp_path)
    assert summarize(stacks, "/ws").startswith("ranks 0-2 in `barrier`")
    assert not ranks_apart(stacks, "/ws")


@pytest.mark.parametrize("gpus, expected", [(2, True), (1, False)])
def test_multi_gpu_nccl_plans_set_the_flight_recorder_with_reasons(gpus: int, expected: bool) -> None:
    recipe = parse_recipe(
        {
            "name": "fr",
            "model": {"path": "m"},
            "data": {"train": [{"path": "d.jsonl"}]},
            "resources": {"gpus_per_node": gpus},
        }
    )
    cards = [
        GpuInfo(index=i, name="NVIDIA H100", memory_mb=81920, compute_capability="9.0") for i in range(2)
    ]
    inventory = WorkerInventory(gpus=cards, cores=32, workspace="/ws", runs_dir="/ws/runs")
    plan = build_launch_plan(recipe, inventory, job_id="j", database="db", attempt_number=1, devices=None)
    env = {v.name: v for v in plan.env}
    assert ("TORCH_NCCL_DUMP_ON_TIMEOUT" in env) is expected
    if expected:
        assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"].value == "2000"
        assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"].value == "1"
        assert env["TORCH_FR_DUMP_TEMP_FILE"].value == "/ws/runs/db/job-j-attempt-1/nccl_trace_rank_"
        assert all(
            "H006" in env[n].reason for n in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT")
        )


def test_cpu_plans_have_no_flight_recorder() -> None:
    recipe = parse_recipe(
        {
            "name": "fr",
            "model": {"path": "m"},
            "data": {"train": [{"path": "d.jsonl"}]},
            "resources": {"gpus_per_node": 2, "accelerator": "cpu"},
        }
    )
    inventory = WorkerInventory(cpu_slots=2, cores=2, workspace="/ws", runs_dir="/ws/runs")
    plan = build_launch_plan(recipe, inventory, job_id="j", database="db", attempt_number=1, devices=[0, 1])
    assert not [v for v in plan.env if v.name.startswith(("TORCH_NCCL", "TORCH_FR"))]


# "ready" is created from the waiting line itself, by C calls only: a signal that comes any time after the
# file exists finds the rank on line 6 of wait_in_collective. Created by Path.touch() before the call, a
# signal under load could still find the rank inside touch.
TRAINER_RANK = """
import os, sys, time
from pathlib import Path
from flightdeck.worker.train.stack_dumps import dump_stacks_on_signals
def wait_in_collective(ready):
    os.close(os.open(ready, os.O_CREAT | os.O_WRONLY)); time.sleep(60)
dump_stacks_on_signals(Path(sys.argv[1]), 2)
wait_in_collective(str(Path(sys.argv[1], "ready")))
"""


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_a_trainer_rank_dumps_its_own_stack_on_sigusr1_and_when_torchrun_ends_it(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGUSR1: the fallback when py-spy cannot read the rank (it lives on). SIGTERM: what torchrun sends
    the survivors after a rank died (H005); the rank still dies of it."""
    script = tmp_path / "rank.py"
    script.write_text(TRAINER_RANK)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "RANK": "2"}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if signum == signal.SIGUSR1:
            stacks = take_rank_stacks([psutil.Process(proc.pid)], tmp_path, use_py_spy=False)
            assert proc.poll() is None  # asked, not ended
        else:
            proc.send_signal(signum)
            assert proc.wait(10) == -signal.SIGTERM  # the default action still runs (chained)
            stacks = stacks_left_on_disk(tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert [(s.rank, s.source) for s in stacks] == [(2, "faulthandler")]
    assert summarize(stacks, str(tmp_path)) == "rank 2 in `wait_in_collective()` at rank.py:6"
