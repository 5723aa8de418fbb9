"""The Slurm executor's reading of Slurm (no cluster needed): `scontrol -o show job` lines as Slurm
22.05 printed them on the tests' cluster, the end states' causes and fixes, the sbatch arguments."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flightdeck.worker.agent import run_attempt
from flightdeck.worker.agent.run_attempt import TOKEN_VARIABLE
from flightdeck.worker.slurm.commands import parse_show_job
from flightdeck.worker.slurm.executor import SlurmSettings, batch_script, sbatch_arguments
from flightdeck.worker.slurm.states import ENDED, slurm_outcome

# Printed by `scontrol -o show job 1` (Slurm 22.05.8) for a finished 2-node job; abridged in the middle.
COMPLETED_LINE = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=0 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A "
    "Partition=debug AllocNode:Sid=localhost:1627 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] "
    "BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 TRES=cpu=2,node=2,billing=2 "
    "Command=(null) WorkDir=/tmp StdErr=/tmp/slurm-1.out StdIn=/dev/null StdOut=/tmp/slurm-1.out Power= "
)
PENDING_LINE = (
    "JobId=7 JobName=flightdeck-3 UserId=root(0) JobState=PENDING Reason=Resources Dependency=(null) "
    "Requeue=0 Restarts=0 BatchFlag=1 ExitCode=0:0 NodeList=(null) Comment=flightdeck attempt 3 of job 2 "
)
NODE_FAIL_LINE = (
    "JobId=9 JobName=flightdeck-5 JobState=NODE_FAIL Reason=NodeDown Requeue=0 ExitCode=0:9 "
    "NodeList=n2 BatchHost=n2"
)


def test_scontrol_lines_read_into_state_reason_nodes_and_exit() -> None:
    done = parse_show_job(COMPLETED_LINE)
    assert (done.job_id, done.state, done.reason, done.nodes) == ("1", "COMPLETED", "None", "n[1-2]")
    assert (done.exit_code, done.signal, done.described) == (0, None, "COMPLETED")
    waiting = parse_show_job(PENDING_LINE)
    # (null) is Slurm's word for no nodes yet; the comment's spaces do not confuse the reading.
    assert (waiting.nodes, waiting.described) == ("", "PENDING (Resources)")
    failed = parse_show_job(NODE_FAIL_LINE)
    assert (failed.signal, failed.described) == (9, "NODE_FAIL (NodeDown)")


@pytest.mark.parametrize(
    ("line", "failure_class", "words"),
    [
        (NODE_FAIL_LINE, "node_failure", "node n2 failed"),
        ("JobId=4 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 NodeList=n1", "timeout", "time limit"),
        ("JobId=4 JobState=OUT_OF_MEMORY Reason=OutOfMemory ExitCode=0:125 NodeList=n1", "oom", "memory"),
        ("JobId=4 JobState=PREEMPTED Reason=None ExitCode=0:15 NodeList=n1", "preempted", "preempted"),
        ("JobId=4 JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 NodeList=n1", "runner", "FAILED"),
    ],
)
def test_each_slurm_end_becomes_a_failure_with_its_cause_and_a_fix(
    line: str, failure_class: str, words: str
) -> None:
    job = parse_show_job(line)
    assert job.state in ENDED
    outcome = slurm_outcome(job, log_tail="last words of the run")
    assert (outcome.status, outcome.failure_class) == ("failed", failure_class)
    assert words in outcome.message and job.described in outcome.message
    assert outcome.fix and outcome.log_tail == "last words of the run"


def test_cancel_outside_flightdeck_is_a_cancel_not_a_failure() -> None:
    outcome = slurm_outcome(parse_show_job("JobId=4 JobState=CANCELLED Reason=None NodeList=n1"))
    assert (outcome.status, outcome.failure_class) == ("cancelled", "cancelled")
    assert "outside Flightdeck" in outcome.message


def test_sbatch_options_from_the_settings_in_order_and_empty_ones_left_out() -> None:
    settings = SlurmSettings(partition="gpu", qos="long", time_limit="04:00:00", extra_options=["--mem=32G"])
    assert settings.sbatch_options() == ["--partition=gpu", "--qos=long", "--time=04:00:00", "--mem=32G"]


def test_sbatch_arguments_turn_slurms_requeue_off_and_name_the_attempt(tmp_path: Path) -> None:
    argv = sbatch_arguments(
        "12", "7", processes=2, job_dir=tmp_path, workdir="/ws", settings=SlurmSettings(partition="gpu")
    )
    assert "--no-requeue" in argv
    assert "--job-name=flightdeck-12" in argv and "--comment=flightdeck attempt 12 of job 7" in argv
    # The database's attempt 12, not another database's (which has the same name).
    named = sbatch_arguments(
        "12",
        "7",
        processes=2,
        job_dir=tmp_path,
        workdir="/ws",
        settings=SlurmSettings(),
        database="20261127-0a1b2c3d",
    )
    assert "--comment=flightdeck attempt 12 of job 7 in database 20261127-0a1b2c3d" in named
    assert argv[2:5] == ["--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2"]
    assert argv[-1] == "--partition=gpu" and f"--output={tmp_path}/slurm-%j.out" in argv


def test_batch_script_starts_one_runner_per_node_with_its_own_tmpdir(tmp_path: Path) -> None:
    script = batch_script(tmp_path / "a b" / "attempt.json", python="/opt/venv/bin/python")
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1" in script
    assert (
        f"/opt/venv/bin/python -m flightdeck.worker.agent.run_attempt '{tmp_path}/a b/attempt.json'" in script
    )
    assert 'export TMPDIR="$(dirname "$0")/tmp-$SLURM_JOB_ID"' in script


def test_standalone_runner_refuses_without_a_token_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    description = tmp_path / "attempt.json"
    attempt = {
        "id": 7,
        "job_id": 1,
        "number": 1,
        "recipe": {},
        "plan": {"run_dir": str(tmp_path)},
        "lease_seconds": 30,
    }
    description.write_text(
        json.dumps({"service_url": "http://127.0.0.1:9", "attempt": attempt, "inventory": {}})
    )
    with pytest.raises(SystemExit, match=f"set {TOKEN_VARIABLE}"):
        run_attempt.main([str(description)])
    # A node with no route to the service needs none: the worker reports for it (worker/agent/outbox.py).
    description.write_text(
        json.dumps({"service_url": "http://127.0.0.1:9", "attempt": attempt, "inventory": {}, "relay": True})
    )
    monkeypatch.setattr(
        run_attempt, "run", lambda described, token: 0 if described.relay and not token else 1
    )
    assert run_attempt.main([str(description)]) == 0


def test_standalone_runner_takes_the_token_out_of_the_environment_and_names_missing_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_VARIABLE, "worker-secret")
    description = tmp_path / "attempt.json"
    description.write_text(json.dumps({"service_url": "http://127.0.0.1:9"}))
    with pytest.raises(SystemExit) as refused:
        run_attempt.main([str(description)])
    message = str(refused.value)
    assert f"{description} is not an attempt description" in message
    # pydantic names each missing field on a line of its own.
    assert "\nattempt\n  Field required" in message and "\ninventory\n  Field required" in message
    # The training processes the runner would start never see the worker's token.
    assert TOKEN_VARIABLE not in os.environ


def test_a_slurm_worker_without_slurms_commands_stops_saying_where_to_run_it(tmp_path: Path) -> None:
    from flightdeck.worker.agent.agent import AgentSettings
    from flightdeck.worker.slurm.worker import run_slurm_worker

    settings = AgentSettings(
        service_url="http://127.0.0.1:9", token="t", workspace=tmp_path, runs_dir=tmp_path
    )
    # An empty PATH: the host has no Slurm client commands.
    with pytest.raises(SystemExit, match="sinfo not found: run the Slurm executor where Slurm's client"):
        run_slurm_worker(settings, SlurmSettings(env={"PATH": str(tmp_path)}))
