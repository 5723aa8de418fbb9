"""A job of several nodes on Slurm, without a cluster: the scheduled plan's open variables, each node's
own run directory, what a node's runner fills in from the allocation and what it leaves to the
executor. `scontrol`/`sinfo` lines as Slurm 22.05.8 printed them on the tests' cluster."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from flightdeck.contracts import ClaimedAttempt
from flightdeck.inventory import notional_inventory
from flightdeck.launch.plan import build_launch_plan, node_plan
from flightdeck.recipe import Recipe
from flightdeck.recipe.schema import slurm_time_seconds
from flightdeck.worker.agent.attempt import AttemptRunner
from flightdeck.worker.agent.classify import Outcome
from flightdeck.worker.agent.environment import launch_environment
from flightdeck.worker.slurm.allocation import AllocationError, NodeFacts, node_facts, parse_node_addresses
from flightdeck.worker.slurm.commands import parse_failed_nodes
from flightdeck.worker.slurm.executor import SlurmSettings, batch_script, sbatch_arguments

from ..agent.processes import tiny_recipe

# `scontrol -o show node n1,n2` (abridged at the end; the OS field holds spaces).
SHOW_NODES = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=11.74 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.236.0.11 NodeHostName=n1 "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 State=IDLE\n"
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=11.74 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.236.0.12 NodeHostName=n2 "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 State=IDLE\n"
)
FACTS = NodeFacts(
    name="n2",
    rank=1,
    nnodes=2,
    master_addr="10.236.0.11",
    local_addr="10.236.0.12",
    interface="eth0",
    port=29511,
)


def _scheduled_plan() -> Any:
    recipe = tiny_recipe(max_steps=4)
    recipe["resources"]["nodes"] = 2
    inventory = notional_inventory(2, "cpu").model_copy(update={"runs_dir": "/shared/runs", "nodes": 2})
    return build_launch_plan(
        Recipe.model_validate(recipe),
        inventory,
        job_id=7,
        database="db",
        attempt_number=1,
        devices=None,
        scheduled=True,
    )


def test_node_addresses_are_slurms_nodeaddr_not_the_hostname() -> None:
    assert parse_node_addresses(SHOW_NODES) == {"n1": "10.236.0.11", "n2": "10.236.0.12"}


def test_a_runner_outside_a_slurm_job_step_says_where_it_must_run() -> None:
    with pytest.raises(AllocationError, match="SLURM_NODEID, SLURM_JOB_NODELIST, SLURMD_NODENAME not set"):
        node_facts({"PATH": "/usr/bin"})


def test_a_node_fills_the_scheduled_plans_open_variables_from_the_allocation() -> None:
    plan = node_plan(_scheduled_plan(), FACTS.rank)
    env, resolved = launch_environment(plan, {}, port=FACTS.port, allocation=FACTS.environment())
    assert (env["MASTER_ADDR"], env["PET_MASTER_ADDR"]) == ("10.236.0.11", "10.236.0.11")
    assert (env["PET_NODE_RANK"], env["PET_LOCAL_ADDR"], env["GLOO_SOCKET_IFNAME"]) == (
        "1",
        "10.236.0.12",
        "eth0",
    )
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29511"
    assert "PET_NODE_RANK=1" in resolved["allocation"]


def test_each_node_of_a_scheduled_plan_has_its_own_run_directory() -> None:
    plan = _scheduled_plan()
    assert node_plan(plan, 0) is plan
    node1 = node_plan(plan, 1)
    assert node1.run_dir == "/shared/runs/db/job-7-attempt-1-node-1"
    assert node1.recipe_path == "/shared/runs/db/job-7-attempt-1-node-1/recipe.json"
    assert node1.argv[-1] == node1.recipe_path and node1.env_value("FLIGHTDECK_RUN_DIR") == node1.run_dir
    assert node1.env_value("FLIGHTDECK_WORKSPACE") == plan.env_value("FLIGHTDECK_WORKSPACE")


def test_a_later_node_leaves_a_failed_torchrun_to_the_executor_but_reports_its_own_preflight() -> None:
    attempt = ClaimedAttempt(
        id=3, job_id=7, number=1, recipe={}, plan=_scheduled_plan().model_dump(), lease_seconds=60.0
    )
    runner = AttemptRunner(
        attempt,
        client=cast(Any, None),
        inventory=notional_inventory(2, "cpu"),
        stop=threading.Event(),
        placed=FACTS,
    )
    assert runner.run_dir == Path("/shared/runs/db/job-7-attempt-1-node-1")
    failed = Outcome("failed", failure_class="exit:1", message="torchrun exited 1")
    assert runner._reports(failed)  # before launch: its own host's preflight
    runner.process = cast(Any, object())  # torchrun was started on this node
    assert not runner._reports(failed)  # maybe a peer node died: the executor asks Slurm first
    assert not runner._reports(Outcome("succeeded"))  # node 0 reports the success
    node0 = AttemptRunner(
        attempt,
        client=cast(Any, None),
        inventory=notional_inventory(2, "cpu"),
        stop=threading.Event(),
        placed=NodeFacts("n1", 0, 2, "10.236.0.11", "10.236.0.11", "eth0", 29511),
    )
    node0.process = cast(Any, object())
    assert node0._reports(Outcome("succeeded")) and not node0._reports(failed)


def test_not_responding_and_down_nodes_are_the_failed_ones() -> None:
    assert parse_failed_nodes("n1 alloc\nn2 idle*\nn3 down*\nn4 down\nn5 mix\n") == ["n2", "n3", "n4"]


def test_the_batch_script_finds_the_rendezvous_port_on_the_first_node_before_srun(tmp_path: Path) -> None:
    script = batch_script(tmp_path / "attempt.json", python="/opt/venv/bin/python")
    port_line = (
        'export FLIGHTDECK_MASTER_PORT="$(/opt/venv/bin/python -m flightdeck.worker.host_preflight.ports)"'
    )
    assert script.index(port_line) < script.index("srun --ntasks-per-node=1")
    argv = sbatch_arguments(
        "3", "7", processes=2, job_dir=tmp_path, workdir="/ws", settings=SlurmSettings(), nodes=2
    )
    assert argv[2:5] == ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2"]


def test_the_batch_scripts_port_command_prints_a_port_and_loads_no_training_library() -> None:
    """It runs on every attempt before srun starts a runner: with the host rules imported by their
    package it loaded torch and the data code first (3.3 s for one port) and runpy warned on stderr."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flightdeck.worker.host_preflight.ports"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and 1024 <= int(done.stdout) <= 65535, done.stdout + done.stderr
    timed = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rpartition("|")[2].strip() for line in timed}
    assert "flightdeck.worker.host_preflight" in imported  # -X importtime did report (its package)
    assert not imported & {"torch", "transformers", "datasets", "numpy"}, sorted(imported)
    assert [line for line in done.stderr.splitlines() if line not in timed] == []  # no warning


def test_slurms_warning_goes_to_the_batch_shell_alone_at_the_workers_lead_time(tmp_path: Path) -> None:
    """Sent to every process of the job, SIGUSR1 would end the ranks' DataLoader workers; the batch shell
    forwards it to the runner instead (what it does on the cluster: tests/slurm/test_slurm_warning.py)."""
    settings = SlurmSettings(warning_seconds=300)
    argv = sbatch_arguments("3", "7", processes=1, job_dir=tmp_path, workdir="/ws", settings=settings)
    assert [a for a in argv if a.startswith("--signal")] == ["--signal=B:USR1@300"]
    assert "--signal=B:USR1@120" in sbatch_arguments(
        "3", "7", processes=1, job_dir=tmp_path, workdir="/ws", settings=SlurmSettings()
    )


def test_a_short_time_limit_shortens_the_warning_so_no_attempt_is_warned_at_its_start(tmp_path: Path) -> None:
    """Slurm may signal up to 60 s early: with a 2-minute limit, the default 120 s warning would stop every
    attempt (and its retry) at its start. The job's own limit counts before the worker's."""

    def signal(settings: SlurmSettings, per_job: dict[str, Any] | None = None) -> list[str]:
        argv = sbatch_arguments(
            "3", "7", processes=1, job_dir=tmp_path, workdir="/ws", settings=settings, per_job=per_job
        )
        return [a for a in argv if a.startswith("--signal")]

    assert signal(SlurmSettings(time_limit="04:00:00")) == ["--signal=B:USR1@120"]
    assert signal(SlurmSettings(time_limit="5")) == ["--signal=B:USR1@120"]  # 5 min: (300 - 60) / 2
    assert signal(SlurmSettings(time_limit="3")) == ["--signal=B:USR1@60"]
    assert signal(SlurmSettings(time_limit="04:00:00"), {"time": "2"}) == ["--signal=B:USR1@30"]
    assert signal(SlurmSettings(), {"time": "01:10"}) == []  # 70 s: too short to be warned at all
    assert signal(SlurmSettings(time_limit="UNLIMITED")) == ["--signal=B:USR1@120"]


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("90", 5400),
        ("05:30", 330),
        ("01:02:03", 3723),
        ("1-12", 129600),
        ("1-00:30", 88200),
        ("2-01:00:05", 176405),
        ("infinite", None),
    ],
)
def test_sbatch_time_forms_in_seconds(given: str, seconds: int | None) -> None:
    assert slurm_time_seconds(given) == seconds


def test_the_recipes_slurm_options_come_after_the_workers_so_that_sbatch_uses_them(tmp_path: Path) -> None:
    settings = SlurmSettings(partition="cpu", time_limit="01:00:00")
    per_job = {"partition": "gpu", "time": "04:00:00", "constraint": None}
    argv = sbatch_arguments(
        "3", "7", processes=1, job_dir=tmp_path, workdir="/ws", settings=settings, per_job=per_job
    )
    assert argv[-4:] == ["--partition=cpu", "--time=01:00:00", "--partition=gpu", "--time=04:00:00"]


def test_a_node_failure_of_a_job_of_two_nodes_names_the_node_that_failed() -> None:
    from flightdeck.worker.slurm.commands import parse_show_job
    from flightdeck.worker.slurm.states import slurm_outcome

    job = parse_show_job(
        "JobId=9 JobName=flightdeck-5 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:9 NodeList=n[1-2]"
    )
    outcome = slurm_outcome(job, failed_nodes=["n2"])
    assert outcome.failure_class == "node_failure" and outcome.message.startswith("node n2 failed"), outcome


# `sinfo -h -N -o "%N %c %G"` as Slurm prints it: no GRES, a typed GPU GRES with its socket binding,
# an untyped one beside another GRES.
SINFO_GRES = "n1 2 (null)\nn2 2 (null)\ng1 64 gpu:a100:4(S:0-1)\ng2 64+ gpu:4,nvme:1\n"


def test_the_partitions_gpus_are_the_smallest_nodes_gres_with_their_type() -> None:
    from flightdeck.worker.slurm.commands import gpu_gres, parse_partition

    assert gpu_gres("gpu:a100:4(S:0-1)") == (4, "a100")
    assert gpu_gres("gpu:a100:2,gpu:v100:1,nvme:1") == (3, "a100|v100")
    assert gpu_gres("(null)") == (0, "")
    gpus_only = "\n".join(SINFO_GRES.splitlines()[2:])
    capacity = parse_partition(gpus_only)
    assert capacity is not None
    assert (capacity.nodes, capacity.cpus_per_node, capacity.gpus_per_node, capacity.gpu_type) == (
        2,
        64,
        4,
        "a100",
    )
    mixed = parse_partition(SINFO_GRES)
    assert mixed is not None and (mixed.nodes, mixed.gpus_per_node) == (4, 0)


def test_a_gpu_partitions_job_asks_slurm_for_a_gpu_per_training_process(tmp_path: Path) -> None:
    argv = sbatch_arguments(
        "3", "7", processes=2, job_dir=tmp_path, workdir="/ws", settings=SlurmSettings(), gpus=True
    )
    assert "--gpus-per-node=2" in argv
    cpu = sbatch_arguments("3", "7", processes=2, job_dir=tmp_path, workdir="/ws", settings=SlurmSettings())
    assert not [a for a in cpu if a.startswith("--gpus")]


def test_a_gpu_property_gres_cannot_prove_is_named_as_unknown_in_why_waiting() -> None:
    from flightdeck.inventory import GpuInfo, WorkerInventory
    from flightdeck.service.why_waiting import Needs, unmet

    unknown = WorkerInventory(gpus=[GpuInfo(index=0, name="a100", memory_mb=0)])
    needs = Needs("gpu", 1, min_capability=8.0, gpu_memory_mb=40 * 1024, script=False)
    assert unknown.facts().startswith("1 GPU(s) (a100, memory unknown, compute unknown)")
    lacks = unmet(needs, unknown)
    assert (
        "compute capability is unknown, so >= 8 is not proven" in lacks[0]
        and "--slurm-gpu-capability" in lacks[0]
    )
    assert "memory is unknown, so >= 40 GB is not proven" in lacks[1] and "--slurm-gpu-memory-gb" in lacks[1]
    known = WorkerInventory(
        gpus=[GpuInfo(index=0, name="a100", memory_mb=20 * 1024, compute_capability="7.0")]
    )
    assert unmet(needs, known) == ["compute capability 7 < 8", "20 GB per GPU < 40 GB"]


def test_the_ranks_get_the_gpus_slurm_allocated_not_the_plans_numbers() -> None:
    recipe = Recipe.model_validate(
        {**tiny_recipe(max_steps=4, processes=1), "resources": {"gpus_per_node": 1}}
    )
    plan = build_launch_plan(
        recipe, notional_inventory(2, "gpu"), job_id=7, database="db", attempt_number=1, devices=[0]
    )
    placed = NodeFacts("n3", 0, 1, "10.236.0.13", "10.236.0.13", "eth0", 0, gpus="1")
    env, resolved = launch_environment(
        plan, {"CUDA_VISIBLE_DEVICES": "0,1"}, port=1, allocation=placed.environment()
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and "CUDA_VISIBLE_DEVICES=1" in resolved["allocation"]
    # A CPU plan keeps its GPUs hidden whatever the allocation holds.
    cpu_plan = node_plan(_scheduled_plan(), 0)
    env, _ = launch_environment(cpu_plan, {}, port=1, allocation=placed.environment())
    assert env["CUDA_VISIBLE_DEVICES"] == ""


# What the batch script's `srun` does here: the first node's runner (it writes its pid where the script says,
# notes Slurm's warning) and srun's slow end on SIGTERM (it waits for the step's tasks).
FAKE_SRUN = """#!/usr/bin/env python3
import os, signal, sys, time
from pathlib import Path
Path(os.environ["FLIGHTDECK_RUNNER_PID_FILE"]).write_text(str(os.getpid()))
signal.signal(signal.SIGUSR1, lambda *_: Path(os.environ["TMPDIR"], "warned").touch())
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(3)))
time.sleep(30)
"""


def test_the_batch_shell_forwards_the_warning_and_outlives_srun_on_sigterm(tmp_path: Path) -> None:
    """Run as bash runs it on the node, with a stand-in for srun (no step to start here): the warning reaches
    the runner, and on a cancel's SIGTERM the shell waits for srun, which an orphaned srun would escape
    (Slurm kills the batch step's process tree after KillWait)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    (tmp_path / "job.sh").write_text(batch_script(tmp_path / "attempt.json", python=sys.executable))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "5"}
    shell = subprocess.Popen(["bash", str(tmp_path / "job.sh")], env=env)
    job_tmp = tmp_path / "tmp-5"
    try:
        deadline = time.monotonic() + 20
        while not (job_tmp / "runner.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        srun = psutil.Process(int((job_tmp / "runner.pid").read_text()))
        shell.send_signal(signal.SIGUSR1)
        while not (job_tmp / "warned").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (job_tmp / "warned").exists() and shell.poll() is None
        shell.send_signal(signal.SIGTERM)
        srun.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert shell.poll() is None and srun.ppid() == shell.pid  # srun is still in the shell's tree
        assert shell.wait(10) == 3  # srun's status
    finally:
        shell.kill()
