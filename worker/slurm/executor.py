"""The Slurm executor: each claimed attempt becomes one Slurm batch job running the attempt runner.

What runs where: this executor (on a login node, or any host with Slurm's client commands) claims
attempts and submits them; inside the allocation `srun` starts the standalone attempt runner
(`python -m worker.agent.run_attempt`), which does the host check on its node, launches torchrun with
the plan's environment and ships metrics and logs to the service itself, as the agent's own runner
does. The executor's source of liveness is Slurm: it polls `scontrol show job`, reports the Slurm job
id and why it waits as attempt events, and reports the end when Slurm says the job ended without the
runner having reported it (node failure, time limit, memory limit, preemption, a cancel).
"""

from __future__ import annotations

import logging
import shlex
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.contracts import attempt_event
from service.inventory import WorkerInventory
from worker.agent import rundir
from worker.agent.agent import recovered_outcome
from worker.agent.attempt import send_finish
from worker.agent.classify import Outcome
from worker.agent.client import AttemptGone, ServiceRefused, ServiceUnavailable
from worker.agent.run_attempt import TOKEN_VARIABLE, AttemptDescription, write_description
from worker.agent.shipping import RunShipper, ShippingRefused
from worker.executors.base import ExecutorSetup
from worker.slurm import commands
from worker.slurm.states import ENDED, slurm_outcome

log = logging.getLogger("flightdeck.slurm")
# Job names start with this, so that a person (or a restarted executor) can find Flightdeck's jobs.
JOB_NAME_PREFIX = "flightdeck-"


@dataclass
class SlurmSettings:
    """`flightdeck worker --executor slurm` settings; empty means Slurm's default for the user."""

    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit: str = ""  # sbatch --time, e.g. 04:00:00
    extra_options: list[str] = field(default_factory=list)  # further sbatch options, as given
    poll_interval: float = 1.0
    # Slurm client environment (SLURM_CONF on hosts where it is not in the default place).
    env: dict[str, str] = field(default_factory=dict)

    def sbatch_options(self) -> list[str]:
        options = []
        for flag, value in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--time", self.time_limit),
        ):
            if value:
                options.append(f"{flag}={value}")
        return options + list(self.extra_options)


def slurm_inventory(settings: SlurmSettings, workspace: Path, runs_dir: Path, name: str) -> WorkerInventory:
    """One worker offering a node of the partition: its CPUs as CPU slots (one gloo process each)."""
    capacity = commands.partition_capacity(settings.partition, commands.client_env(**settings.env))
    return WorkerInventory(
        hostname=name,
        address="",
        cpu_slots=capacity.cpus_per_node,
        cores=capacity.cpus_per_node,
        workspace=str(workspace),
        runs_dir=str(runs_dir),
    )


def batch_script(description: Path, python: str = sys.executable) -> str:
    """The batch script: `srun` starts one attempt runner per node of the allocation."""
    runner = f"{shlex.quote(python)} -m worker.agent.run_attempt {shlex.quote(str(description))}"
    return (
        "#!/bin/bash\n"
        "# Written by Flightdeck's Slurm executor: the attempt runner, once per node.\n"
        # torchelastic's temporary directories stay inside the job's own directory.
        'export TMPDIR="$(dirname "$0")/tmp-$SLURM_JOB_ID"; mkdir -p "$TMPDIR"\n'
        f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 {runner}\n"
    )


def sbatch_arguments(
    attempt_id: str, job_id: str, *, processes: int, job_dir: Path, workdir: str, settings: SlurmSettings
) -> list[str]:
    """sbatch's options for one attempt: one node, one runner on it with a CPU per training process."""
    return [
        f"--job-name={JOB_NAME_PREFIX}{attempt_id}",
        f"--comment=flightdeck attempt {attempt_id} of job {job_id}",
        "--nodes=1",
        "--ntasks-per-node=1",
        f"--cpus-per-task={max(processes, 1)}",
        # Flightdeck decides what runs again; Slurm's requeue would restart a failure behind its back.
        "--no-requeue",
        # Ahead of the time limit (and a preemption, with PreemptParameters=send_user_signal): the
        # trainer saves a checkpoint and stops, and the retry resumes from it (docs/slurm.md).
        "--signal=USR1@120",
        f"--output={job_dir}/slurm-%j.out",
        f"--chdir={workdir}",
        *settings.sbatch_options(),
    ]


class SlurmExecutor:
    name = "slurm"

    def __init__(self, settings: SlurmSettings, setup: ExecutorSetup, *, service_url: str):
        self.settings = settings
        self.client, self.inventory, self.stop = setup.client, setup.inventory, setup.stop
        self.service_url, self.agent_name = service_url, setup.agent_name
        self.cancel_grace, self.allowed_roots = setup.cancel_grace, setup.allowed_roots
        self.scripts_dir, self.on_done = setup.scripts_dir, setup.on_done

    def submit(self, attempt: dict[str, Any]) -> SlurmExecution:
        execution = SlurmExecution(self, attempt)
        threading.Thread(target=execution.watch, name=f"slurm-{execution.attempt_id}", daemon=True).start()
        return execution


class SlurmExecution:
    """One attempt as one Slurm job; `watch()` (its thread) submits it and follows it to the end."""

    def __init__(self, executor: SlurmExecutor, attempt: dict[str, Any]):
        self.executor = executor
        self.attempt = attempt
        self.attempt_id = str(attempt["id"])
        self.job_id = str(attempt["job_id"])
        self._devices = [int(d) for d in attempt["plan"].get("devices", [])]
        self.run_dir = Path(attempt["plan"]["run_dir"])
        self.job_dir = Path(executor.inventory.runs_dir) / "slurm" / self.attempt_id
        self.slurm_job_id = ""
        self.last_state: commands.JobState | None = None
        self.cancel_reason: str | None = None
        self.done = threading.Event()
        self._cancel = threading.Event()

    @property
    def devices(self) -> list[int]:
        return self._devices

    def poll(self) -> str:
        return self.last_state.described if self.last_state else "SUBMITTING"

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
            self._cancel.set()

    @property
    def _env(self) -> dict[str, str]:
        return commands.client_env(**self.executor.settings.env)

    def watch(self) -> None:
        try:
            self._watch()
        except Exception as exc:
            log.exception("attempt %s: Slurm executor error", self.attempt_id)
            if self.slurm_job_id:
                try:
                    commands.cancel(self.slurm_job_id, self._env)
                except commands.SlurmError:
                    log.exception("attempt %s: scancel %s failed", self.attempt_id, self.slurm_job_id)
            self._finish(
                Outcome("failed", failure_class="agent", message=f"the Slurm executor failed: {exc!r}")
            )
        finally:
            self.done.set()
            self.executor.on_done()

    def _submit(self) -> None:
        ex = self.executor
        self.job_dir.mkdir(parents=True, exist_ok=True)
        description = self.job_dir / "attempt.json"
        write_description(
            description,
            AttemptDescription(
                service_url=ex.service_url,
                attempt=self.attempt,
                inventory=ex.inventory,
                agent_name=ex.agent_name,
                allowed_roots=[str(p) for p in ex.allowed_roots],
                scripts_dir=str(ex.scripts_dir) if ex.scripts_dir else None,
                cancel_grace=ex.cancel_grace,
            ),
        )
        script = self.job_dir / "job.sh"
        script.write_text(batch_script(description))
        argv = sbatch_arguments(
            self.attempt_id,
            self.job_id,
            processes=len(self._devices),
            job_dir=self.job_dir,
            workdir=ex.inventory.workspace or str(self.job_dir),
            settings=ex.settings,
        )
        argv.append(str(script))
        # The runner acts as this worker: its token travels in the job's environment, never argv.
        self.slurm_job_id = commands.submit(argv, {**self._env, TOKEN_VARIABLE: ex.client.token})
        log.info("attempt %s: Slurm job %s submitted", self.attempt_id, self.slurm_job_id)
        self._event(
            "slurm:job", f"Slurm job {self.slurm_job_id} submitted", {"slurm_job_id": self.slurm_job_id}
        )

    def _watch(self) -> None:
        try:
            self._submit()
        except commands.SlurmError as exc:
            self._finish(
                Outcome(
                    "failed",
                    failure_class="slurm_submit",
                    message=f"sbatch refused the attempt: {exc}",
                    fix="Check the Slurm settings (partition, account, QOS, time limit, extra options) "
                    "against `sinfo` and `sacctmgr show assoc user=$USER`.",
                )
            )
            return
        reported = ""
        scancel_sent = False
        while True:
            if self._cancel.is_set() and not scancel_sent:
                commands.cancel(self.slurm_job_id, self._env)
                scancel_sent = True
            state = commands.show_job(self.slurm_job_id, self._env)
            if state is None:
                self._ended(None)
                return
            self.last_state = state
            if state.described != reported:
                reported = state.described
                self._event(
                    f"slurm:{state.state.lower()}",
                    f"Slurm job {self.slurm_job_id}: {state.described}",
                    {
                        "slurm_job_id": self.slurm_job_id,
                        "state": state.state,
                        "reason": state.reason,
                        "nodes": state.nodes,
                    },
                )
            if state.state in ENDED:
                self._ended(state)
                return
            if self.executor.stop.is_set() and not self._cancel.is_set():
                return  # the executor stops; the job runs on and its runner reports its end
            self._cancel.wait(self.executor.settings.poll_interval)

    def _ended(self, state: commands.JobState | None) -> None:
        """Slurm says the job ended: ship what is left, and report the end unless the runner did."""
        try:
            RunShipper(self.run_dir, self.attempt_id, self.executor.client).drain()
        except (AttemptGone, ServiceUnavailable, ServiceRefused, ShippingRefused, OSError) as exc:
            log.warning("attempt %s: run files not shipped after the job ended: %s", self.attempt_id, exc)
        meta = rundir.read_json(self.run_dir / rundir.ATTEMPT_FILE) or {}
        if meta.get("state") == "finished" and str(meta.get("attempt_id")) == self.attempt_id:
            return  # the runner reported the outcome itself
        if self.cancel_reason is not None:
            where = f"Slurm job {self.slurm_job_id} {state.described if state else 'ended'}"
            outcome = Outcome(
                "cancelled",
                failure_class="cancelled",
                message=f"cancelled ({self.cancel_reason}); {where}, no process of it is left",
                log_tail=rundir.log_tail(self.run_dir)[-4000:],
            )
        elif state is not None and state.state in ("COMPLETED", "FAILED") and meta:
            # The runner exited by itself without delivering its report: its run directory says how.
            outcome = recovered_outcome(self.run_dir, meta) or slurm_outcome(
                state, rundir.log_tail(self.run_dir)
            )
        elif state is None:
            outcome = Outcome(
                "failed",
                failure_class="runner",
                message=f"Slurm forgot job {self.slurm_job_id} before its end was seen",
                fix="Raise MinJobAge in slurm.conf above the executor's poll interval.",
            )
        else:
            outcome = slurm_outcome(state, rundir.log_tail(self.run_dir))
        self._finish(outcome)

    def _finish(self, outcome: Outcome) -> None:
        send_finish(self.executor.client, self.attempt_id, self.run_dir, outcome)

    def _event(self, key: str, message: str, data: dict[str, Any]) -> None:
        try:
            self.executor.client.send_events(
                self.attempt_id, [attempt_event(key, "slurm", message, data=data)]
            )
        except (AttemptGone, ServiceUnavailable, ServiceRefused) as exc:
            log.warning("attempt %s: event not sent: %s", self.attempt_id, exc)
