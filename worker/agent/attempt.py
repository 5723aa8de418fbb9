"""Runs one claimed attempt: run directory, host preflight, torchrun, shipping, cancel, exit report."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flightdeck.contracts import (
    CHECKPOINT_STOP_CODE,
    RESULT_FILE,
    SCRIPT_END_EVENT,
    AttemptNotRunning,
    ClaimedAttempt,
    attempt_event,
)
from flightdeck.inventory import WorkerInventory
from flightdeck.launch.plan import LaunchPlan, node_plan
from flightdeck.worker.agent import rundir
from flightdeck.worker.agent.classify import Outcome, classify_exit
from flightdeck.worker.agent.client import (
    AttemptClient,
    AttemptGone,
    ServiceRefused,
    ServiceUnavailable,
)
from flightdeck.worker.agent.host_check import HostCheck, run_host_check
from flightdeck.worker.agent.job_environment_step import job_environment_for
from flightdeck.worker.agent.launch import compose_launch
from flightdeck.worker.agent.log_metrics import fill_metrics_from_log
from flightdeck.worker.agent.process import AttemptProcess
from flightdeck.worker.agent.rank_stacks import (
    RanksReport,
    RankStack,
    ranks_report,
    stacks_left_on_disk,
    take_rank_stacks,
)
from flightdeck.worker.agent.resume import Resume, resolve_resume
from flightdeck.worker.agent.shipping import RunShipper, ShippingRefused
from flightdeck.worker.agent.teardown import (
    TeardownWatch,
    TrainerEndInLog,
    dump_stacks,
    innermost_frames,
    live_ranks,
    rank_cpu_seconds,
    trainer_dumps,
)
from flightdeck.worker.agent.workspace_writes import WorkspaceWatch
from flightdeck.worker.host_preflight.ports import ResolvedPort, resolve_master_port

if TYPE_CHECKING:
    from flightdeck.worker.slurm.allocation import NodeFacts

log = logging.getLogger("flightdeck.agent")
# How long shipping waits after the service refused this worker (401/403) before it tries again.
REFUSED_RETRY_SECONDS = 30.0
# Pause between asks of the start barrier (each ask itself waits up to 10 s for the other nodes).
NODE_READY_POLL_SECONDS = 0.2


class ShippingThread(threading.Thread):
    """Ships a run's files every `interval` until the writer is done and everything is acknowledged."""

    def __init__(self, shipper: RunShipper | None, stop: threading.Event, interval: float = 1.0):
        """`shipper` None: nothing to ship here (the executor carries the run files)."""
        super().__init__(name=f"ship-{shipper.attempt_id if shipper else 'none'}", daemon=True)
        self.shipper = shipper
        self.stop = stop
        self.interval = interval
        self.writer_done = threading.Event()

    def run(self) -> None:
        while self.shipper is not None and not self.stop.is_set():
            final = self.writer_done.is_set()
            try:
                sent = self.shipper.ship(final=final)
            except AttemptGone:
                log.warning(
                    "attempt %s is unknown to the service; not shipping its files", self.shipper.attempt_id
                )
                return
            except ServiceUnavailable:
                continue  # the client retried until told to stop; the loop condition decides
            except ShippingRefused:
                # Logged by the shipper; the cursor did not move, so nothing is lost meanwhile.
                self.stop.wait(REFUSED_RETRY_SECONDS)
                continue
            if final and not sent:
                return
            if not sent:
                self.writer_done.wait(self.interval)


class AttemptRunner:
    """Owns one attempt from claim to finish; `cancel()` may be called from any thread."""

    def __init__(
        self,
        attempt: ClaimedAttempt,
        *,
        client: AttemptClient,
        inventory: WorkerInventory,
        stop: threading.Event,
        cancel_grace: float = 10.0,
        ship_interval: float = 1.0,
        allowed_roots: tuple[Path, ...] = (),
        scripts_dir: Path | None = None,
        agent_name: str = "",
        placed: NodeFacts | None = None,
        ships: bool = True,
    ):
        self.attempt_id = str(attempt.id)
        self.job_id = str(attempt.job_id)
        self.number = attempt.number
        self.claimed_at = attempt.claimed_at
        self.job_started_at = attempt.job_started_at
        self.recipe: dict[str, Any] = attempt.recipe
        self.plan = LaunchPlan.model_validate(attempt.plan)
        # A node of a multi-node attempt: it starts torchrun only when every node is ready.
        self.node_rank = attempt.node.rank if attempt.node else 0
        self.nnodes = attempt.node.nnodes if attempt.node else 1
        # A node of a job its scheduler placed (Slurm): every node runs the one plan, in its own run
        # directory, with the allocation's facts; no start barrier (the scheduler started the nodes
        # together and torchrun's rendezvous waits for the rest). Only node 0 ships and reports a
        # success: the metrics are global rank 0's; any node reports its failure.
        self.placed = placed
        if placed is not None:
            self.node_rank, self.nnodes = placed.rank, placed.nnodes
            self.plan = node_plan(self.plan, placed.rank)
        self.outcome: Outcome | None = None
        self.run_dir = Path(self.plan.run_dir)
        # False where the executor carries the run files (a node with no route to the service).
        self.ships = ships
        self.client = client
        self.inventory = inventory
        self.stop = stop
        self.cancel_grace = cancel_grace
        self.ship_interval = ship_interval
        self.allowed_roots = allowed_roots
        self.scripts_dir = scripts_dir
        self.agent_name = agent_name
        self.cancel_reason: str | None = None
        self._cancel = threading.Event()
        self.process: AttemptProcess | None = None
        self.done = threading.Event()

    @property
    def devices(self) -> list[int]:
        return list(self.plan.devices)

    @property
    def nodes(self) -> int:
        return 1  # this host (one node of a gang's attempt, or a single-node attempt)

    def poll(self) -> str:
        """The executor interface's state: `running` until the runner's thread is done."""
        return "done" if self.done.is_set() else "running"

    def cancel(self, reason: str) -> None:
        if not self._cancel.is_set():
            self.cancel_reason = reason
            self._cancel.set()

    def run(self) -> None:
        """The thread body: never raises; reports the outcome unless the agent is shutting down."""
        try:
            outcome = self.outcome = self._run()
            if outcome is not None and self.placed is not None and self.node_rank:
                outcome.message = f"node {self.node_rank} ({self.placed.name}): {outcome.message}"
            if outcome is not None and self._reports(outcome):
                self._finish(outcome)
        except Exception as exc:
            log.exception("attempt %s: agent error", self.attempt_id)
            if self.process is not None:
                self.process.stop(self.cancel_grace)
            if not self.stop.is_set():
                # Where it failed, so that the report names the code to look at; the traceback is in the
                # agent's own log, not the job's.
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                where = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
                message = f"the worker agent failed: {exc!r} ({where}; the traceback is in the agent's log)"
                self.outcome = Outcome(
                    "failed",
                    failure_class="agent",
                    message=message[:2000],
                    fix="a fault of Flightdeck's worker, not a verdict on the job: report it with the agent's log, "
                    "and submit the job again",
                )
                self._finish(self.outcome)
        finally:
            self.done.set()

    def _run(self) -> Outcome | None:
        meta = {
            "attempt_id": self.attempt_id,
            "job_id": self.job_id,
            "number": self.number,
            "claimed_at": self.claimed_at,
            # Which run of the job this attempt belongs to: a retry's checkpoint search compares it.
            "job_started_at": self.job_started_at,
            "agent": self.agent_name,
        }
        rundir.prepare_run_dir(self.run_dir, meta, self.recipe, self.plan.model_dump())
        shipping = ShippingThread(self._shipper() if self.ships else None, self.stop, self.ship_interval)
        check = run_host_check(
            self.recipe,
            self.inventory,
            self.plan.devices,
            extra_roots=self.allowed_roots,
            run_dir=self.run_dir,
            scripts_dir=self.scripts_dir,
        )
        if check.effective is not None:
            rundir.write_json(self.run_dir / rundir.RECIPE_FILE, check.effective)
        self._send_events(check.events())
        if check.errors:
            return _preflight_failure(check)
        if self._cancel.is_set():
            return Outcome(
                "cancelled",
                failure_class="cancelled",
                message=f"cancelled before launch ({self.cancel_reason})",
            )
        resume = self._resume_point()
        # The interpreter the agent, and so torch and flightdeck.worker.train, is installed in; a script
        # job's own environment when it asks for one.
        python = sys.executable
        if (self.recipe.get("entrypoint") or {}).get("requirements"):
            shipping.start()  # pip's output is the job's log while the environment builds
            built = job_environment_for(self.recipe, self.inventory, self.run_dir, self._cancel.is_set)
            self._send_events(built.events)
            if built.outcome is not None:
                shipping.writer_done.set()
                shipping.join()
                return built.outcome
            python = built.python
        # Last before the launch: a port resolved here is bound by torchrun moments later (E002).
        port = self._rendezvous_port()
        if isinstance(port, Outcome):
            if shipping.ident is not None:  # started for the environment's build: its log is shipped
                shipping.writer_done.set()
                shipping.join()
            return port
        launch = compose_launch(
            self.plan,
            os.environ,
            port=port,
            python=python,
            resume_from=resume.path,
            allocation=self.placed.environment() if self.placed is not None else None,
        )
        rundir.write_json(self.run_dir / rundir.PLAN_FILE, launch.record(self.plan))
        self._send_events(launch.events(self.plan))
        self._send_events(resume.events)
        # A script job runs in its attempt's own directory: what it writes by relative path (checkpoints,
        # snapshots) is never seen by another run of the same script. The trainer resolves its paths.
        cwd = str(self.run_dir) if self.recipe.get("entrypoint") else self.inventory.workspace or os.getcwd()
        writes = self._workspace_watch()
        self.process = AttemptProcess(launch.argv, launch.env, cwd, self.run_dir / rundir.LOG_FILE)
        log.info("attempt %s: torchrun pid %d in %s", self.attempt_id, self.process.pid, self.run_dir)
        if shipping.ident is None:  # not started for the environment's build
            shipping.start()
        outcome = self._supervise(self.process)
        if writes is not None:
            self._send_events(writes.events())  # H009: what the run wrote outside its directory
        if self.recipe.get("entrypoint"):
            fill_metrics_from_log(self.run_dir)  # nothing else reported steps: the Trainer's own log lines
        shipping.writer_done.set()
        shipping.join()
        if self.stop.is_set():
            return None
        return outcome

    def _reports(self, outcome: Outcome) -> bool:
        """Whether this runner sends the finish itself. On a node of a scheduled job of several nodes,
        a torchrun that failed may have failed because a peer node died (its connections broke before
        the scheduler noticed the node): the executor reports that end once the scheduler has seen every
        node (worker/slurm/executor.py), from what this run directory records."""
        if self.placed is None or self.nnodes == 1:
            return True
        if outcome.status == "succeeded":
            return self.node_rank == 0
        return self.process is None  # failed before launch (host preflight): this node's own cause

    def _shipper(self) -> RunShipper:
        """What this runner ships: everything, or on a scheduled job's node after the first, its own log
        as that node's (the executor's one worker holds every node; rank 0 and its metrics are on node 0)."""
        if self._reports_success:
            return RunShipper(self.run_dir, self.attempt_id, self.client)
        return RunShipper(self.run_dir, self.attempt_id, self.client, node=self.node_rank, metrics=False)

    @property
    def _reports_success(self) -> bool:
        """Whether this runner ships the run's metrics and reports its success: all but a scheduled job's
        nodes after the first (they still report their own failure, which ends the attempt)."""
        return self.placed is None or self.node_rank == 0

    def _resume_point(self) -> Resume:
        """A retry's checkpoint: a script job's always looked for, a recipe's when it saves checkpoints."""
        saves = (self.recipe.get("training") or {}).get("save_steps")
        if not self.recipe.get("entrypoint") and not saves:
            return Resume()
        return resolve_resume(self.run_dir, self.number, self.job_started_at)

    def _rendezvous_port(self) -> ResolvedPort | Outcome:
        """The attempt's one rendezvous port: resolved here for a single node; node 0's for every node of
        a gang (node 0 resolves it and reports it at the start barrier) or of a scheduler's allocation
        (its batch script resolved it on the first node); the outcome when a gang stops before it starts."""
        if self.placed is not None and self.nnodes > 1:
            return ResolvedPort(
                self.placed.port, "the allocation's, resolved by the batch script on its first node"
            )
        if self.nnodes > 1:
            return self._await_nodes()
        return resolve_master_port(self.plan.env_value("MASTER_PORT"))

    def _await_nodes(self) -> ResolvedPort | Outcome:
        """The start barrier of a multi-node attempt: report this node ready (node 0 with the port it
        resolved) and wait until every node is; node 0's port, or the outcome when the attempt stops
        first (a node failed host preflight or was lost, or a cancel)."""
        own = resolve_master_port(self.plan.env_value("MASTER_PORT")) if self.node_rank == 0 else None
        port = own.port if own is not None else None
        while True:
            try:
                answer = self.client.node_ready(self.attempt_id, self.node_rank, port)
            except (AttemptGone, AttemptNotRunning, ServiceRefused) as exc:
                return Outcome(
                    "cancelled", failure_class="cancelled", message=f"stopped before launch: {exc}"
                )
            except ServiceUnavailable:
                answer = None  # retried inside the client until stopping; the checks below decide
            if answer is not None and answer.start and answer.master_port is not None:
                if own is not None and own.port == answer.master_port:
                    return own
                return ResolvedPort(answer.master_port, "node 0's, reported at the nodes' start barrier")
            if answer is not None and answer.abort:
                return Outcome(
                    "cancelled",
                    failure_class="cancelled",
                    message=f"stopped before launch: {answer.abort}",
                )
            if self._cancel.is_set() or self.stop.is_set():
                return Outcome(
                    "cancelled",
                    failure_class="cancelled",
                    message=f"cancelled before launch ({self.cancel_reason or 'the agent is stopping'})",
                )
            self._cancel.wait(NODE_READY_POLL_SECONDS)

    def _supervise(self, process: AttemptProcess) -> Outcome | None:
        teardown = self._teardown_watch(process)
        while True:
            code = process.poll()
            if code is not None:
                # Kept for recovery: an agent that dies before 'finish' is delivered reports it on restart.
                rundir.set_state(self.run_dir, "running", exit_code=code)
                outcome = classify_exit(
                    code, rundir.read_json(self.run_dir / RESULT_FILE), rundir.log_tail(self.run_dir)
                )
                if outcome.status == "failed" and teardown.finished_everywhere():
                    return self._crashed_in_teardown(outcome)
                if outcome.status == "failed":
                    # A rank died (H005, or an error): the survivors torchrun then ended dumped their
                    # stacks on SIGTERM (worker/train/stack_dumps); a health stop (42) leaves none.
                    ranks = self._where_ranks_were(
                        lambda: stacks_left_on_disk(self.run_dir), "when a rank died"
                    )
                    if ranks is not None:
                        # After the first line (what failed), before the fix and the log lines.
                        head, newline, rest = outcome.message.partition("\n")
                        outcome.message = f"{head}; where the ranks were: {ranks.summary}{newline}{rest}"
                        outcome.ranks, outcome.ranks_apart = ranks.summary, ranks.apart
                return outcome
            if self._cancel.is_set() or self.stop.is_set():
                return self._stop(process)
            if teardown.ended_now():
                # The service's stall watch (H003) leaves a run alone once its script has ended.
                self._send_events(
                    [
                        attempt_event(
                            SCRIPT_END_EVENT,
                            "run",
                            f"{self._what_runs} ended (or is leaving its process group) on every rank"
                            if teardown.bare_end is None
                            else "the script's training ended; its ranks left have sat idle since",
                        )
                    ]
                )
            elif teardown.overdue():
                return self._end_teardown(process, teardown)
            self._cancel.wait(0.5)

    def _workspace_watch(self) -> WorkspaceWatch | None:
        """For a script job (it runs with the worker's rights, anywhere by path): the workspace listed."""
        if not self.recipe.get("entrypoint") or not self.inventory.workspace:
            return None
        runs = Path(self.inventory.runs_dir) if self.inventory.runs_dir else None
        return WorkspaceWatch(Path(self.inventory.workspace), self.run_dir, runs)

    def _teardown_watch(self, process: AttemptProcess) -> TeardownWatch:
        """Watches for the run's end on every rank of this node (H008): the markers an instrumented script's
        ranks or the recipe trainer's write; a bare launch by the ranks that exit and the Trainer's
        end-of-training line in its log. A recipe job needs it too: after its result, NCCL's
        destroy_process_group or torchrun's exit barrier can hang, and no stall watch judges a run that
        has passed its last step."""
        entry = self.recipe.get("entrypoint") or {}
        grace = float((self.recipe.get("health") or {}).get("teardown_grace_seconds", 30.0))
        instrumented = entry.get("instrument") is not False
        # The recipe trainer's ranks are all Flightdeck's: every rank process counts, instrumented or not.
        only_instrumented = bool(entry) and instrumented
        return TeardownWatch(
            self.run_dir,
            self.plan.nproc_per_node,
            grace,
            rank_cpu=lambda: rank_cpu_seconds(process.living(), only_instrumented),
            bare_end=None if instrumented else TrainerEndInLog(lambda: rundir.log_tail(self.run_dir)),
        )

    def _end_teardown(self, process: AttemptProcess, teardown: TeardownWatch) -> Outcome:
        """The run ended on every rank (or on some, the others idle since) but processes remain: their
        stacks taken, then end them, with an H008 warning naming the ranks. A script ended, or the trainer
        trained to its end: it succeeded; the trainer stopped it (its ranks' exit code): as it said."""
        grace = teardown.grace
        bare = teardown.bare_end is not None
        script = bool(self.recipe.get("entrypoint"))
        what = self._what_runs
        ranks = live_ranks(process.living(), instrumented=script and not bare)
        frames: list[str] = []
        if not bare:  # a bare rank has no stack dumper on the signal (SIGUSR1 would just end it)
            dump_stacks([pid for _, pid in ranks])
            time.sleep(1.0)  # faulthandler writes within milliseconds; the log is read after
            # A script's rank dumps into the log; the trainer's into its own file (worker/train/stack_dumps).
            dumped = rundir.log_tail(self.run_dir) if script else trainer_dumps(self.run_dir, ranks)
            frames = innermost_frames(dumped)
        process.stop(self.cancel_grace)
        who = ", ".join(f"rank {rank} (pid {pid})" for rank, pid in ranks) or "torchrun"
        where = f", waiting in {' <- '.join(frames)}" if frames else ""
        if teardown.left_behind and bare:
            behind = ", ".join(f"rank {rank}" for rank in teardown.left_behind)
            seen = (
                f"{', '.join(f'rank {rank}' for rank in teardown.exited)} exited"
                if teardown.exited
                else "the Trainer printed its end-of-training summary"
            )
            message = (
                f"{seen}, and {behind} used no CPU for {grace:.0f} s without exiting (a bare launch: no "
                "stack taken): hung as its script ended (a destructor, a process group or a thread left "
                "running); the agent ended it"
            )
        elif teardown.left_behind:
            behind = ", ".join(f"rank {rank}" for rank in teardown.left_behind)
            message = (
                f"the script ended on another rank, and {behind} used no CPU for {grace:.0f} s without "
                f"returning from it{where}: hung as its script ended (a destructor, a process group or a "
                "thread left running); the agent ended it"
            )
        else:
            message = (
                f"{what} ended (or was leaving its process group) on every rank but {who} was still "
                f"running {grace:.0f} s later{where}: hung in teardown (a process group, DataLoader "
                "workers or a thread left running); the agent ended it"
            )
        self._send_events(
            [
                attempt_event(
                    "health:H008", "health", message, code="H008", severity="warn", fix=self._teardown_fix
                )
            ]
        )
        code = teardown.exit_code()
        rundir.set_state(self.run_dir, "running", exit_code=code)
        if code != 0:
            # The trainer stopped the run (a health stop, a signal's checkpoint) and hung leaving: the
            # outcome is the one its ranks would have exited with.
            result = rundir.read_json(self.run_dir / RESULT_FILE) or {}
            return classify_exit(code, result, rundir.log_tail(self.run_dir))
        return self._finished_despite_teardown(message)

    def _crashed_in_teardown(self, failed: Outcome) -> Outcome:
        """Every rank of this node ended its run (its end marker, exit code 0), then a process died as it
        exited: a thread of the process group torn down at interpreter exit ("terminate called without an
        active exception", SIGABRT) and the like. The work is done: it succeeded, with an H008 warning
        that quotes the crash."""
        crash = failed.message.partition("\n")[0]
        message = (
            f"{self._what_runs} ended on every rank, then a process died as it exited ({crash}): a crash "
            "in teardown, after the run's work was done"
        )
        self._send_events(
            [
                attempt_event(
                    "health:H008", "health", message, code="H008", severity="warn", fix=self._teardown_fix
                )
            ]
        )
        return self._finished_despite_teardown(message)

    def _finished_despite_teardown(self, message: str) -> Outcome:
        result = rundir.read_json(self.run_dir / RESULT_FILE) or {}
        return Outcome(
            "succeeded",
            None,
            message=f"training finished; {message}",
            log_tail=rundir.log_tail(self.run_dir)[-4000:],
            output_path=result.get("output_path"),
        )

    @property
    def _teardown_fix(self) -> str:
        if self.recipe.get("entrypoint"):
            return (
                "end what the script started before it returns: dist.destroy_process_group(), join or "
                "daemonize threads, shut down DataLoader workers (persistent_workers) and executors"
            )
        return (
            "nothing to change in the recipe for this: the trainer had written its result (the attempt "
            "ends as it says). If it recurs on this host, the stacks in the log say where teardown waited "
            "(NCCL's destroy_process_group, or torchrun waiting for another node at its exit)"
        )

    @property
    def _what_runs(self) -> str:
        return "the script" if self.recipe.get("entrypoint") else "the trainer"

    def checkpoints_on(self) -> bool:
        """A recipe job that saves checkpoints: its trainer saves one more on SIGUSR1 before a stop."""
        return not self.recipe.get("entrypoint") and bool(
            (self.recipe.get("training") or {}).get("save_steps")
        )

    def request_checkpoint(self) -> None:
        """Ask the trainer's ranks for a checkpoint and a stop (SIGUSR1); the attempt then ends G017."""
        if self.process is not None and self.checkpoints_on():
            pids = self.process.request_checkpoint()
            log.info("attempt %s: asked ranks %s for a checkpoint before stopping", self.attempt_id, pids)

    def _checkpoint_before_stop(self, process: AttemptProcess) -> str:
        """The stop's grace for a run with checkpoints on: the trainer saves at the next step and exits
        (G017) within `cancel_grace`, or is stopped as any other run. What to add to the message."""
        self.request_checkpoint()
        deadline = time.monotonic() + self.cancel_grace
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        result = rundir.read_json(self.run_dir / RESULT_FILE) or {}
        if result.get("failure_code") == CHECKPOINT_STOP_CODE:
            return f"; the trainer saved a checkpoint first ({result.get('message')})"
        return f"; no checkpoint saved within the {self.cancel_grace:.0f} s grace"

    def _stop(self, process: AttemptProcess) -> Outcome | None:
        """Stop every process of the attempt; report cancelled only once none is left."""
        saved = self._checkpoint_before_stop(process) if self.checkpoints_on() else ""
        # Before any signal: where each rank is (a stall the service stopped, H003, names its ranks).
        ranks = None
        if self._cancel.is_set():
            ranks = self._where_ranks_were(
                lambda: take_rank_stacks(process.living(), self.run_dir), "when stopped"
            )
        survivors = process.stop(self.cancel_grace)
        while survivors:
            log.error(
                "attempt %s: processes %s survived SIGKILL; retrying",
                self.attempt_id,
                [p.pid for p in survivors],
            )
            time.sleep(2)
            survivors = process.stop(0)
        if self.stop.is_set() and not self._cancel.is_set():
            return None
        return Outcome(
            "cancelled",
            exit_code=process.popen.returncode,
            failure_class="cancelled",
            message=f"cancelled ({self.cancel_reason}); no process of the attempt is left"
            + saved
            + (f"; where the ranks were: {ranks.summary}" if ranks is not None else ""),
            log_tail=rundir.log_tail(self.run_dir)[-4000:],
            ranks=ranks.summary if ranks is not None else None,
            ranks_apart=ranks is not None and ranks.apart,
        )

    def _where_ranks_were(
        self, read_stacks: Callable[[], list[RankStack]], moment: str
    ) -> RanksReport | None:
        """Report the ranks' places (an event, the dumps in the log); never fails the stop itself."""
        try:
            ranks = ranks_report(read_stacks(), self.run_dir, self.inventory.workspace)
        except Exception:
            log.exception("attempt %s: reading the ranks' stacks failed", self.attempt_id)
            return None
        if ranks is not None:
            log.info("attempt %s: where the ranks were %s: %s", self.attempt_id, moment, ranks.summary)
            self._send_events([ranks.event(moment)])
        return ranks

    def _send_events(self, events: list[dict[str, Any]]) -> None:
        if events and self.node_rank:
            # Each node checks its own host: its events keep their own keys, and say which node.
            events = [
                {
                    **e,
                    "key": f"node{self.node_rank}:{e.get('key')}",
                    "message": f"node {self.node_rank}: {e.get('message')}",
                }
                for e in events
            ]
        if events:
            try:
                self.client.send_events(self.attempt_id, events)
            except (AttemptGone, ServiceUnavailable, ServiceRefused) as exc:
                log.warning("attempt %s: events not sent: %s", self.attempt_id, exc)

    def _finish(self, outcome: Outcome) -> None:
        send_finish(self.client, self.attempt_id, self.run_dir, outcome)


def send_finish(client: AttemptClient, attempt_id: str, run_dir: Path, outcome: Outcome) -> None:
    """POST the outcome once; never raises, so a refused report is not followed by a different one."""
    try:
        answer = client.finish(attempt_id, outcome.report())
        why = "" if outcome.status == "succeeded" else f" ({outcome.failure_class}: {outcome.message[:300]})"
        log.info("attempt %s: %s%s -> job %s", attempt_id, outcome.status, why, answer.get("job_status"))
    except AttemptNotRunning as exc:
        log.info("attempt %s: the service already has it as %s", attempt_id, exc.status)
    except ServiceRefused as exc:
        # Another report would not fare better (and a second, different finish would misreport
        # the run); the attempt ends by its lease.
        log.error("attempt %s: the service refused the finish report: %s", attempt_id, exc)
        return
    except (AttemptGone, ServiceUnavailable) as exc:
        log.warning("attempt %s: finish not delivered: %s", attempt_id, exc)
        return
    rundir.set_state(run_dir, "finished")


def _preflight_failure(check: HostCheck) -> Outcome:
    lines = [f"{f['code'] or 'host'} {f['path']}: {f['message']}" for f in check.errors]
    first = check.errors[0]
    return Outcome(
        "failed",
        failure_class="preflight",
        failure_code=first.get("code"),
        message="preflight: " + "; ".join(lines),
        fix=first.get("fix"),
        findings=check.findings,
    )
