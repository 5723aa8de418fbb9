"""The Slurm executor: each claimed attempt becomes one Slurm batch job running the attempt runner.

What runs where: this executor (on a login node, or any host with Slurm's client commands) claims
attempts and submits them; inside the allocation `srun` starts the standalone attempt runner
(`python -m flightdeck.worker.agent.run_attempt`), which does the host check on its node, launches torchrun with
the plan's environment and ships metrics and logs to the service itself, as the agent's own runner
does. The executor's source of liveness is Slurm: it polls `scontrol show job`, reports the Slurm job
id and why it waits as attempt events, and reports the end when Slurm says the job ended without the
runner having reported it (node failure, time limit, memory limit, preemption, a cancel).
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightdeck.contracts import ClaimedAttempt, attempt_event
from flightdeck.inventory import GpuInfo, WorkerInventory
from flightdeck.launch.plan import LaunchPlan, node_plan
from flightdeck.recipe.schema import slurm_time_seconds
from flightdeck.worker.agent import rundir
from flightdeck.worker.agent.agent import recovered_outcome
from flightdeck.worker.agent.attempt import send_finish
from flightdeck.worker.agent.classify import Outcome
from flightdeck.worker.agent.client import AttemptGone, ServiceRefused, ServiceUnavailable
from flightdeck.worker.agent.outbox import OutboxRelay
from flightdeck.worker.agent.run_attempt import TOKEN_VARIABLE, AttemptDescription, write_description
from flightdeck.worker.agent.shipping import RunShipper, ShippingRefused
from flightdeck.worker.executors.base import ExecutorSetup
from flightdeck.worker.slurm import commands, restart_state
from flightdeck.worker.slurm.allocation import PORT_VARIABLE, RUNNER_PID_VARIABLE
from flightdeck.worker.slurm.states import ENDED, slurm_outcome

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
    # Seconds before the time limit (or a preemption) that Slurm warns the job (sbatch --signal): the
    # trainer saves a checkpoint at its next step and stops; a step and a save must fit in it.
    warning_seconds: int = 120
    # What GRES cannot say of the partition's GPUs (`gpu:a100:4` names a count and a type): their memory
    # and compute capability, as the admin documents them. 0 / "": unknown, so a recipe that needs a
    # capability (bf16) or an amount of GPU memory is not claimed, and why-waiting says which is unknown.
    gpu_memory_gb: float = 0.0
    gpu_capability: str = ""
    # Slurm client environment (SLURM_CONF on hosts where it is not in the default place).
    env: dict[str, str] = field(default_factory=dict)
    # The worker's saved identity (restart_state.py); None: restart_state.default_state_file(name, url).
    state_file: Path | None = None
    # The compute nodes have no route to the service: the executor carries their run files from the
    # shared filesystem while the job runs (worker/agent/outbox.py); their runners talk to no one.
    relay: bool = False

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
    """One worker offering the partition: its nodes, each with the smallest node's GPUs (GRES, their
    memory and capability from the settings, else unknown) or, on a partition without GPUs, its CPUs as
    CPU slots (one gloo process each); a job of up to that many nodes becomes one Slurm job."""
    capacity = commands.partition_capacity(settings.partition, commands.client_env(**settings.env))
    gpus = [
        GpuInfo(
            index=index,
            name=capacity.gpu_type or "gpu",
            memory_mb=int(settings.gpu_memory_gb * 1024),
            compute_capability=settings.gpu_capability or "0.0",
        )
        for index in range(capacity.gpus_per_node)
    ]
    return WorkerInventory(
        hostname=name,
        address="",
        gpus=gpus,
        cpu_slots=0 if gpus else capacity.cpus_per_node,
        cores=capacity.cpus_per_node,
        nodes=capacity.nodes,
        workspace=str(workspace),
        runs_dir=str(runs_dir),
    )


def batch_script(description: Path, python: str = sys.executable) -> str:
    """The batch script: `srun` starts one attempt runner per node of the allocation.

    It runs on the allocation's first node, where the rendezvous of a job of several nodes listens: the
    port is found free there, before any node starts, and travels to every runner in srun's environment.
    Slurm's warning ahead of a time limit or a preemption (`--signal=B:USR1@N`) reaches only this shell,
    which passes it to the first node's runner; the runner passes it to the trainer's ranks alone. Sent
    to every process of the step instead, it would end the ranks' DataLoader workers (started by exec,
    they hold no handler for it) and fail the run it was meant to save.
    """
    py = shlex.quote(python)
    runner = f"{py} -m flightdeck.worker.agent.run_attempt {shlex.quote(str(description))}"
    return (
        "#!/bin/bash\n"
        "# Written by Flightdeck's Slurm executor: the attempt runner, once per node.\n"
        "set -e\n"
        # torchelastic's temporary directories stay inside the job's own directory.
        'export TMPDIR="$(dirname "$0")/tmp-$SLURM_JOB_ID"; mkdir -p "$TMPDIR"\n'
        f'export {PORT_VARIABLE}="$({py} -m flightdeck.worker.host_preflight.ports)"\n'
        f'export {RUNNER_PID_VARIABLE}="$TMPDIR/runner.pid"\n'
        # Slurm's warning: the first node's runner asks the ranks for a checkpoint; every rank then
        # agrees at the next step's end to save and stop (worker/train/checkpoint_stop.py).
        f'forward_warning() {{ [ -s "${RUNNER_PID_VARIABLE}" ] && kill -USR1 "$(cat "${RUNNER_PID_VARIABLE}")" || true; }}\n'
        "trap forward_warning USR1\n"
        "set +e\n"
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {runner} &\n"
        "step=$!\n"
        # A cancel or a node failure signals srun too: this shell outlives it, so that srun stays in the
        # batch step's process tree, which Slurm kills after KillWait (an orphaned srun escapes it).
        "trap true TERM INT\n"
        # A trapped signal ends `wait` early: wait again until srun itself has ended, and end with its status.
        'wait "$step"; status=$?\n'
        'while kill -0 "$step" 2>/dev/null; do wait "$step"; status=$?; done\n'
        'exit "$status"\n'
    )


def job_comment(attempt_id: str, job_id: str, database: str, claimed_at: float | None = None) -> str:
    """The Slurm job's comment, which names the attempt among all of the cluster's jobs: attempt ids
    start again at 1 in each database (and a database restored from a backup hands them out again,
    made at another moment), so the job name (`flightdeck-<attempt>`) alone does not. A restarted
    executor whose sbatch never answered finds its job by name and this comment."""
    comment = f"flightdeck attempt {attempt_id} of job {job_id}"
    comment += f" in database {database}" if database else ""
    return comment + (f" made {claimed_at:.6f}" if claimed_at is not None else "")


def sbatch_arguments(
    attempt_id: str,
    job_id: str,
    *,
    processes: int,
    job_dir: Path,
    workdir: str,
    settings: SlurmSettings,
    nodes: int = 1,
    gpus: bool = False,
    per_job: dict[str, Any] | None = None,
    database: str = "",
    claimed_at: float | None = None,
) -> list[str]:
    """sbatch's options for one attempt: its nodes, one runner on each with a CPU per training process;
    the recipe's `resources.slurm` (`per_job`, validated at submit) after the worker's settings, so that
    sbatch, which takes the last of a repeated option, uses the job's. `gpus`: the worker offers the
    partition's GPUs, so each training process is one GPU of Slurm's (GRES)."""
    job_options = [
        f"--{flag}={value}"
        for flag, value in (per_job or {}).items()
        if value is not None and flag in _PER_JOB
    ]
    limit = slurm_time_seconds((per_job or {}).get("time") or settings.time_limit or "")
    warning = warning_seconds(settings.warning_seconds, limit)
    return [
        f"--job-name={JOB_NAME_PREFIX}{attempt_id}",
        f"--comment={job_comment(attempt_id, job_id, database, claimed_at)}",
        f"--nodes={max(nodes, 1)}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={max(processes, 1)}",
        *([f"--gpus-per-node={max(processes, 1)}"] if gpus else []),
        # Flightdeck decides what runs again; Slurm's requeue would restart a failure behind its back.
        "--no-requeue",
        # Ahead of the time limit (and a preemption, with PreemptParameters=send_user_signal), to the
        # batch shell only (B:), which forwards it to the ranks (batch_script): the trainer saves a
        # checkpoint and stops, and the retry resumes from it (docs/slurm.md).
        *([f"--signal=B:USR1@{warning}"] if warning else []),
        f"--output={job_dir}/slurm-%j.out",
        f"--chdir={workdir}",
        *settings.sbatch_options(),
        *job_options,
    ]


# Slurm may send a --signal warning up to this much earlier than asked (its event handling's resolution).
SIGNAL_EARLY_SECONDS = 60


def warning_seconds(configured: int, limit: int | None) -> int:
    """How long before the time limit Slurm warns the job; 0: not at all. A job whose limit is known gets
    at most half of what is left of it after Slurm's slack: a warning as long as the job (a 2-minute
    limit with the default 120 s) would come at its start, and every attempt would save and stop at once,
    each retry too."""
    if limit is None:
        return configured
    cap = (limit - SIGNAL_EARLY_SECONDS) // 2
    return min(configured, cap) if cap >= 10 else 0


# resources.slurm's fields, each the sbatch option of the same name (flightdeck/recipe/schema.py SlurmSpec).
_PER_JOB = ("partition", "time", "constraint")


class SlurmExecutor:
    name = "slurm"

    def __init__(self, settings: SlurmSettings, setup: ExecutorSetup, *, service_url: str):
        self.settings = settings
        self.client, self.inventory, self.stop = setup.client, setup.inventory, setup.stop
        self.service_url, self.agent_name = service_url, setup.agent_name
        self.cancel_grace, self.allowed_roots = setup.cancel_grace, setup.allowed_roots
        self.scripts_dir, self.on_done = setup.scripts_dir, setup.on_done
        self._node_failure_wait: float | None = None
        # This worker as registered (remember_identity): the jobs' runners renew their attempts' leases.
        self.worker_id, self.heartbeat_interval = "", 10.0
        # What held_attempts() found, by attempt id: adopt() acts on the very attempts the registration
        # named (registering may save another database's identity in between).
        self._held: dict[str, list[tuple[Path, ClaimedAttempt]]] = {}

    def node_failure_wait(self) -> float:
        """How long a job's end waits for Slurm to notice a dead node: its SlurmdTimeout and a margin."""
        if self._node_failure_wait is None:
            try:
                timeout = commands.slurmd_timeout(commands.client_env(**self.settings.env))
            except commands.SlurmError as exc:
                log.warning("SlurmdTimeout unknown (%s); waiting up to 300 s for a dead node", exc)
                timeout = 300.0
            self._node_failure_wait = min(timeout + 30.0, 900.0)
        return self._node_failure_wait

    def submit(self, attempt: ClaimedAttempt) -> SlurmExecution:
        execution = SlurmExecution(self, attempt)
        threading.Thread(target=execution.watch, name=f"slurm-{execution.attempt_id}", daemon=True).start()
        return execution

    # --- a restarted executor finds its Slurm jobs again (worker/executors/base.py AdoptingExecutor) ---

    @property
    def _state_file(self) -> Path:
        return self.settings.state_file or restart_state.default_state_file(self.agent_name, self.service_url)

    @property
    def _earlier_state_file(self) -> Path | None:
        """The default of a release that named the file by the worker alone: read when the per-service
        file holds nothing for this worker, removed once the identity is saved there (an upgrade)."""
        return None if self.settings.state_file else restart_state.earlier_default_state_file(self.agent_name)

    def saved_identity(self) -> restart_state.SavedIdentity | None:
        for path in (self._state_file, self._earlier_state_file):
            saved = path and restart_state.load_identity(
                path, name=self.agent_name, service_url=self.service_url
            )
            if saved:
                return saved
        return None

    def remember_identity(self, worker_id: str, token: str, heartbeat_interval: float, database: str) -> None:
        self.worker_id, self.heartbeat_interval = worker_id, heartbeat_interval
        restart_state.save_identity(
            self._state_file,
            name=self.agent_name,
            service_url=self.service_url,
            worker_id=worker_id,
            token=token,
            database=database,
        )
        if self._earlier_state_file is not None:
            # It holds the same token; only this worker's for this service goes (another service's stays).
            restart_state.forget_identity(
                self._earlier_state_file, name=self.agent_name, service_url=self.service_url
            )

    def held_attempts(self) -> list[str]:
        """Attempts an earlier life of this executor submitted and never saw end (restart_state.py
        `unsettled_attempts`: of the database its saved identity registered with)."""
        saved = self.saved_identity()
        found = restart_state.unsettled_attempts(
            Path(self.inventory.runs_dir), self.agent_name, saved.database if saved else ""
        )
        self._held = {}
        for job_dir, description in found:  # the saved database's folder first, then the older layout
            self._held.setdefault(str(description.attempt.id), []).append((job_dir, description.attempt))
        return sorted(self._held, key=int)

    def adopt(self, keep: list[str], stop: list[str]) -> list[SlurmExecution]:
        """Watch the kept attempts' Slurm jobs again (submitting one whose sbatch never answered); cancel
        the Slurm jobs of those the service no longer runs here (requeued meanwhile), so no job runs twice."""
        env = commands.client_env(**self.settings.env)
        for attempt_id in stop:
            # Every job directory of that id: without a saved database, each folder's attempt 7 is stopped.
            for job_dir, attempt in self._held.get(attempt_id, []):
                slurm_job = restart_state.recorded_slurm_job(job_dir) or self._job_named(
                    job_dir, attempt, env
                )
                if slurm_job:
                    log.info(
                        "attempt %s ended while the executor was away: scancel %s", attempt_id, slurm_job
                    )
                    commands.cancel(slurm_job, env)
                restart_state.mark_settled(job_dir)
        adopted = []
        for attempt_id in keep:
            if attempt_id not in self._held:
                continue
            job_dir, attempt = self._held[attempt_id][0]  # the registered database's, listed first
            execution = SlurmExecution(self, attempt)
            execution.slurm_job_id = restart_state.recorded_slurm_job(job_dir) or self._job_named(
                job_dir, attempt, env
            )
            execution.adopted = True
            threading.Thread(target=execution.watch, name=f"slurm-{attempt_id}", daemon=True).start()
            adopted.append(execution)
        return adopted

    def _job_named(self, job_dir: Path, attempt: ClaimedAttempt, env: dict[str, str]) -> str:
        """The Slurm job of an attempt whose sbatch never answered (none recorded), by name and comment."""
        database = restart_state.database_of(job_dir, self.inventory.runs_dir)
        comment = job_comment(str(attempt.id), str(attempt.job_id), database, attempt.claimed_at)
        return commands.job_named(f"{JOB_NAME_PREFIX}{attempt.id}", comment, env)


class SlurmExecution:
    """One attempt as one Slurm job; `watch()` (its thread) submits it and follows it to the end."""

    def __init__(self, executor: SlurmExecutor, attempt: ClaimedAttempt):
        self.executor = executor
        self.attempt = attempt
        self.attempt_id = str(attempt.id)
        self.job_id = str(attempt.job_id)
        self._devices = [int(d) for d in attempt.plan.get("devices", [])]
        self.run_dir = Path(attempt.plan["run_dir"])
        self.nnodes = int(attempt.plan.get("nnodes", 1))
        # Set where the nodes cannot reach the service: this executor carries their run files.
        self.relay = (
            OutboxRelay(self._node_run_dirs(), self.attempt_id, executor.client)
            if executor.settings.relay
            else None
        )
        self.job_dir = restart_state.job_dir(self.run_dir, self.attempt_id)
        self.slurm_job_id = ""
        self.last_state: commands.JobState | None = None
        self.cancel_reason: str | None = None
        self.done = threading.Event()
        self._cancel = threading.Event()
        # Found again by a restarted executor: its Slurm job (if sbatch answered) is watched, not submitted.
        self.adopted = False
        # The end was reported (or the attempt handed back): nothing for a restarted executor to watch.
        self.settled = False

    @property
    def devices(self) -> list[int]:
        return self._devices

    @property
    def nodes(self) -> int:
        return self.nnodes

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
            self.settled = True
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
            if self.settled:
                restart_state.mark_settled(self.job_dir)
            self.done.set()
            self.executor.on_done()

    def _submit(self) -> None:
        ex = self.executor
        self._clear_earlier()
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
                allocation="slurm",
                worker_id=ex.worker_id,
                heartbeat_interval=ex.heartbeat_interval,
                relay=ex.settings.relay,
            ),
        )
        script = self.job_dir / "job.sh"
        script.write_text(batch_script(description))
        argv = sbatch_arguments(
            self.attempt_id,
            self.job_id,
            database=restart_state.database_of(self.job_dir, ex.inventory.runs_dir),
            claimed_at=self.attempt.claimed_at,
            processes=len(self._devices),
            nodes=self.nnodes,
            gpus=bool(ex.inventory.gpus),
            per_job=(self.attempt.recipe.get("resources") or {}).get("slurm"),
            job_dir=self.job_dir,
            workdir=ex.inventory.workspace or str(self.job_dir),
            settings=ex.settings,
        )
        argv.append(str(script))
        # The runner acts as this worker: its token travels in the job's environment, never argv (and
        # not at all to nodes that cannot reach the service: the executor reports for them).
        env = {**self._env, TOKEN_VARIABLE: ex.client.token}
        if ex.settings.relay:
            del env[TOKEN_VARIABLE]  # sbatch exports its environment: this worker's own may hold one
        self.slurm_job_id = commands.submit(argv, env)
        restart_state.record_slurm_job(self.job_dir, self.slurm_job_id)
        log.info("attempt %s: Slurm job %s submitted", self.attempt_id, self.slurm_job_id)
        self._event(
            "slurm:job", f"Slurm job {self.slurm_job_id} submitted", {"slurm_job_id": self.slurm_job_id}
        )

    def _clear_earlier(self) -> None:
        """What an earlier attempt of the same id left in the job directory and the nodes' run
        directories (a database restored from a backup makes the id again) moves into `replaced-<n>/`
        before this attempt's Slurm job exists: its `settled` mark would hide this attempt from a
        restarted executor, its Slurm job id would be taken for this one's, and its finish report or
        result for this attempt's end (the runner's prepare_run_dir does the same, but only once it runs).
        """
        claimed_at = self.attempt.claimed_at
        if rundir.is_other_attempt(
            restart_state.described_attempt(self.job_dir), self.attempt_id, claimed_at
        ):
            rundir.set_aside(self.job_dir)
        for run_dir in self._node_run_dirs():
            meta = rundir.read_json(run_dir / rundir.ATTEMPT_FILE)
            if rundir.is_other_attempt(meta, self.attempt_id, claimed_at):
                rundir.set_aside(run_dir)

    def _watch(self) -> None:
        if self.adopted and self.slurm_job_id:
            log.info("attempt %s: Slurm job %s found again", self.attempt_id, self.slurm_job_id)
            self._event(
                "slurm:adopted",
                f"Slurm job {self.slurm_job_id} found again by the restarted executor",
                {"slurm_job_id": self.slurm_job_id},
            )
        else:
            self._submit_or_finish()
            if self.settled:
                return
        self._follow()

    def _submit_or_finish(self) -> None:
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

    def _follow(self) -> None:
        """Poll Slurm until the job ends (then report it), or until the executor stops (the job runs on)."""
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
            if self.relay is not None and state.state == "RUNNING":
                self.relay.relay()
            self._cancel.wait(self.executor.settings.poll_interval)

    def _ended(self, state: commands.JobState | None) -> None:
        """Slurm says the job ended: ship what is left, and report the end unless the runner did."""
        if self.relay is not None:
            self.relay.relay(final=True)  # every node's files, and the finish a runner left
            if self.relay.reported():
                self._close_node_dirs()
                self.settled = True
                return
        try:
            RunShipper(self.run_dir, self.attempt_id, self.executor.client).drain()
        except (AttemptGone, ServiceUnavailable, ServiceRefused, ShippingRefused, OSError) as exc:
            log.warning("attempt %s: run files not shipped after the job ended: %s", self.attempt_id, exc)
        meta = rundir.read_json(self.run_dir / rundir.ATTEMPT_FILE) or {}
        if self.relay is None and any(
            node.get("state") == "finished" and str(node.get("attempt_id")) == self.attempt_id
            for node in self._node_metas()
        ):
            self._close_node_dirs()
            self.settled = True
            return  # a runner reported the outcome itself
        if self.cancel_reason is not None:
            where = f"Slurm job {self.slurm_job_id} {state.described if state else 'ended'}"
            outcome = Outcome(
                "cancelled",
                failure_class="cancelled",
                message=f"cancelled ({self.cancel_reason}); {where}, no process of it is left",
                log_tail=rundir.log_tail(self.run_dir)[-4000:],
            )
        elif state is not None and state.state in ("COMPLETED", "FAILED") and self.nnodes > 1:
            outcome = self._nodes_outcome(state)
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
            failed = None
            if state.state in ("NODE_FAIL", "BOOT_FAIL") and state.nodes:
                try:
                    failed = commands.failed_nodes(state.nodes, self._env)
                except commands.SlurmError as exc:
                    log.warning("attempt %s: which node failed is unknown: %s", self.attempt_id, exc)
            outcome = slurm_outcome(state, rundir.log_tail(self.run_dir), failed)
        self._finish(outcome)
        self._close_node_dirs()

    def _close_node_dirs(self) -> None:
        """The attempt was reported: no node's run directory is left for a restarted worker to recover
        (worker/agent/agent.py `_recover`) and report again."""
        if self.nnodes > 1:
            for run_dir in self._node_run_dirs()[1:]:
                if (run_dir / rundir.ATTEMPT_FILE).exists():
                    rundir.set_state(run_dir, "finished")

    def _nodes_outcome(self, state: commands.JobState) -> Outcome:
        """The end of a job of several nodes that no runner reported: a node that died (its runner left
        neither torchrun's exit nor a stop in its run directory) is a node failure once Slurm has it as
        down (after SlurmdTimeout; the survivors' torchrun failed at once on the broken connections);
        otherwise the first node whose run directory says how its torchrun ended."""
        run_dirs = self._node_run_dirs()
        metas = self._node_metas()
        silent = [
            rank
            for rank, meta in enumerate(metas)
            if not isinstance(meta.get("exit_code"), int) and meta.get("state") not in ("stopped", "finished")
        ]
        if silent and state.nodes:
            failed = self._await_failed_nodes(state.nodes)
            if failed:
                as_failed = dataclasses.replace(
                    state, state="NODE_FAIL", reason=f"the job ended {state.state}"
                )
                return slurm_outcome(as_failed, rundir.log_tail(self.run_dir), failed)
        for run_dir, meta in zip(run_dirs, metas, strict=True):
            outcome = recovered_outcome(run_dir, meta) if meta else None
            if outcome is not None and outcome.status != "succeeded":
                return outcome
        return recovered_outcome(self.run_dir, metas[0]) or slurm_outcome(
            state, rundir.log_tail(self.run_dir)
        )

    def _node_run_dirs(self) -> list[Path]:
        """Each node's run directory (node 0's is the plan's: flightdeck/launch/plan.py `node_plan`)."""
        plan = LaunchPlan.model_validate(self.attempt.plan)
        return [Path(node_plan(plan, rank).run_dir) for rank in range(self.nnodes)]

    def _node_metas(self) -> list[dict[str, Any]]:
        return [rundir.read_json(d / rundir.ATTEMPT_FILE) or {} for d in self._node_run_dirs()]

    def _await_failed_nodes(self, node_list: str) -> list[str]:
        """The job's nodes Slurm has as down, waiting up to SlurmdTimeout (and a margin) for it to notice."""
        deadline = time.monotonic() + self.executor.node_failure_wait()
        while True:
            try:
                failed = commands.failed_nodes(node_list, self._env)
            except commands.SlurmError as exc:
                log.warning("attempt %s: which node failed is unknown: %s", self.attempt_id, exc)
                return []
            if failed or time.monotonic() > deadline:
                return failed
            time.sleep(self.executor.settings.poll_interval)

    def _finish(self, outcome: Outcome) -> None:
        self.settled = True
        send_finish(self.executor.client, self.attempt_id, self.run_dir, outcome)

    def _event(self, key: str, message: str, data: dict[str, Any]) -> None:
        try:
            self.executor.client.send_events(
                self.attempt_id, [attempt_event(key, "slurm", message, data=data)]
            )
        except (AttemptGone, ServiceUnavailable, ServiceRefused) as exc:
            log.warning("attempt %s: event not sent: %s", self.attempt_id, exc)
