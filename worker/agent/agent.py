"""The agent's main loop: register, heartbeat, claim attempts while devices are free, run each in a thread."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightdeck.contracts import RESULT_FILE, AttemptNotRunning, ClaimedAttempt, Registered
from flightdeck.inventory import WorkerInventory
from flightdeck.launch.plan import database_runs
from flightdeck.worker.agent import rundir
from flightdeck.worker.agent.attempt import send_finish
from flightdeck.worker.agent.classify import Outcome, classify_exit
from flightdeck.worker.agent.client import AttemptGone, ServiceRefused, ServiceUnavailable, WorkerClient
from flightdeck.worker.agent.free_capacity import FreeCapacity, free_capacity
from flightdeck.worker.agent.inventory import detect_inventory
from flightdeck.worker.agent.shipping import RunShipper, ShippingRefused
from flightdeck.worker.executors.base import AdoptingExecutor, Execution, Executor, ExecutorSetup
from flightdeck.worker.executors.inprocess import InProcessExecutor
from flightdeck.worker.log_noise import silence_known_noise

log = logging.getLogger("flightdeck.agent")


class ClaimAbandoned(BaseException):
    """Raised by the stop signal's handler into the claim long-poll it interrupts (Agent._on_stop_signal).
    A BaseException, as KeyboardInterrupt is: no handler on the way (the client's retries) takes it for
    a failed request."""


@dataclass
class AgentSettings:
    service_url: str
    token: str
    workspace: Path
    runs_dir: Path
    cpu_slots: int | None = None
    name: str = ""
    poll_wait: float = 20.0
    cancel_grace: float = 10.0
    # Directories besides the workspace and runs dir that recipe paths may point into (S001).
    allowed_roots: tuple[Path, ...] = ()
    # False (--no-scripts): the worker runs recipe jobs only, never a script job's own code.
    runs_scripts: bool = True
    # Where script jobs' programs must lie, relative to the workspace (None: anywhere S001 allows).
    scripts_dir: Path | None = None
    # The address other nodes reach this host at ("": what the hostname resolves to).
    address: str = ""


class Agent:
    """One worker: the claim loop in the calling thread, heartbeats and attempts in their own."""

    def __init__(
        self,
        settings: AgentSettings,
        inventory: WorkerInventory | None = None,
        executor: Executor | None = None,
    ):
        self.settings = settings
        self.stop = threading.Event()
        self.client = WorkerClient(settings.service_url, settings.token, stop=self.stop)
        self.inventory = inventory or detect_inventory(
            str(settings.workspace.resolve()),
            str(settings.runs_dir.resolve()),
            settings.cpu_slots,
            runs_scripts=settings.runs_scripts,
            address=settings.address,
        )
        self.name = settings.name or socket.gethostname()
        self.worker_id = ""
        self.heartbeat_interval = 10.0
        # The service's database (from registration): this agent's runs live in <runs>/<database>/.
        self.database = ""
        self._changed = threading.Event()
        self._lock = threading.Lock()
        # The main thread is inside a claim's long-poll (the stop signal abandons it there).
        self._claiming = False
        # Where claimed attempts run (worker/executors/); by default on threads of this process.
        self.executor: Executor = executor or InProcessExecutor(self.executor_setup())
        self.runners: dict[str, Execution] = {}

    def executor_setup(self) -> ExecutorSetup:
        """What any executor of this agent takes from it (worker/executors/base.py)."""
        return ExecutorSetup(
            client=self.client,
            inventory=self.inventory,
            stop=self.stop,
            agent_name=self.name,
            cancel_grace=self.settings.cancel_grace,
            allowed_roots=self.settings.allowed_roots,
            scripts_dir=self.settings.scripts_dir,
            on_done=self._changed.set,
        )

    def run(self) -> None:
        """Until stop(): register, recover unfinished runs, claim and run attempts."""
        Path(self.inventory.runs_dir).mkdir(parents=True, exist_ok=True)
        if isinstance(self.executor, AdoptingExecutor):
            self._register_and_adopt(self.executor)  # before _recover, which skips adopted runs
        else:
            self._register()
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._recover, name="recover", daemon=True).start()
        try:
            self._claim_loop()
        finally:
            self.stop.set()
            for runner in self._running():
                runner.done.wait(self.settings.cancel_grace + 15)
            self.client.close()

    def request_stop(self, *_: Any) -> None:
        log.info("stopping: running attempts are stopped and left to their leases")
        self.stop.set()
        self._changed.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)

    def _on_stop_signal(self, *_: Any) -> None:
        """SIGTERM or SIGINT. Python runs the handler in the main thread, the one that claims: a claim
        long-polling (up to poll_wait, 20 s) is abandoned at once, so an idle agent stops in well under
        a second, not when its poll ends. Its connection closes with it, and the service hands back an
        attempt claimed for a connection that has gone (service/api/claim_long_poll.py): the job loses
        no attempt. An answer already on its way as the signal comes is the race the service's side
        names too: that attempt waits for its lease."""
        self.request_stop()
        if self._claiming:
            self._claiming = False
            raise ClaimAbandoned

    def _register_and_adopt(self, executor: AdoptingExecutor) -> None:
        """Register as the worker of the executor's saved identity (its token kept: the scheduler's
        running jobs hold it too) with the attempts it still holds; watch those the service still runs
        here, and let the executor stop the others. Without a saved identity (or once the service no
        longer knows it) this is a first registration, and every held attempt is stopped."""
        saved = executor.saved_identity()
        held = executor.held_attempts()
        if saved is not None:
            self.client.use_token(saved.token)
        answer = self._register(keep_token=saved is not None, held=held)
        stop = [str(a) for a in answer.stop]
        if held:
            log.info("attempts of an earlier life: %s; %s ended meanwhile", held, stop or "none")
        for execution in executor.adopt([a for a in held if a not in stop], stop):
            with self._lock:
                self.runners[execution.attempt_id] = execution

    def _register(self, *, keep_token: bool = False, held: list[str] | None = None) -> Registered:
        """Register (the enrolment token, or this worker's own one), then act only as this worker.

        The agent's own token lives in memory only: a file beside the runs would be readable by the
        training code the agent launches. A restarted agent enrols again; the name is free once the
        previous agent has been silent for a lease. (An executor whose attempts outlive it saves it
        elsewhere, and registers with it: `_register_and_adopt`.)
        """
        while True:
            try:
                answer = self.client.register(
                    self.name, self.inventory, keep_token=keep_token, held=held or []
                )
                break
            except ServiceRefused as exc:
                if exc.status_code == 401 and self.client.token != self.settings.token:
                    self.client.use_token(self.settings.token)  # a new database forgot this worker: enrol
                    continue
                if exc.status_code == 409 and not self.stop.is_set():
                    log.warning(
                        "%s: the previous agent of this name is still within its lease; retrying", exc
                    )
                    self.stop.wait(5.0)
                    continue
                raise
        self.client.use_token(answer.token)
        self.worker_id = str(answer.id)
        self.heartbeat_interval = answer.heartbeat_interval or 10.0
        self.database = answer.database
        log.info(
            "registered as %s (%s) with %d %s",
            self.name,
            self.worker_id,
            self.inventory.device_count,
            "GPUs" if self.inventory.gpus else "CPU slots",
        )
        if isinstance(self.executor, AdoptingExecutor):
            self.executor.remember_identity(
                self.worker_id, answer.token, self.heartbeat_interval, answer.database
            )
        return answer

    def _running(self) -> list[Execution]:
        with self._lock:
            return [r for r in self.runners.values() if not r.done.is_set()]

    def _free(self) -> FreeCapacity:
        indices = (
            [g.index for g in self.inventory.gpus]
            if self.inventory.gpus
            else list(range(self.inventory.cpu_slots))
        )
        held = [(runner.devices, runner.nodes) for runner in self._running()]
        return free_capacity(indices, self.inventory.nodes, held)

    def _claim_loop(self) -> None:
        try:
            while not self.stop.is_set():
                free = self._free()
                if not free.devices:
                    self._changed.wait(1.0)
                    self._changed.clear()
                    continue
                try:
                    self._claiming = True
                    if self.stop.is_set():
                        break  # the signal came before the flag: it raised nothing, and no poll starts
                    # An unreachable service is retried inside the client (tenacity, backing off to 5 s)
                    # until it answers or the agent stops.
                    attempt = self.client.claim(
                        self.worker_id, free.devices, self.settings.poll_wait, free.nodes
                    )
                    self._claiming = False  # answered: a signal from here on leaves it to _start
                except ServiceUnavailable:
                    continue  # only when stopping: the loop ends
                except AttemptGone:
                    self._register()  # the service forgot this worker (new database): register again
                    continue
                finally:
                    self._claiming = False
                if attempt is not None:
                    self._start(attempt)
        except ClaimAbandoned:
            pass  # the poll the stop signal interrupted (raised inside the client, or as the loop left it)

    def _start(self, attempt: ClaimedAttempt) -> None:
        if self.stop.is_set():
            # A long-poll answered while stopping: hand it back so the job costs no attempt and waits
            # for no lease; if that fails, the lease ends it as before.
            try:
                self.client.release(str(attempt.id))
                log.info("attempt %s claimed while stopping; handed back", attempt.id)
            except (AttemptGone, ServiceRefused, ServiceUnavailable, AttemptNotRunning) as exc:
                log.warning("attempt %s claimed while stopping; left to its lease (%s)", attempt.id, exc)
            return
        runner = self.executor.submit(attempt)
        with self._lock:
            self.runners[runner.attempt_id] = runner
        log.info(
            "attempt %s of job %s claimed on devices %s (%s)",
            runner.attempt_id,
            runner.job_id,
            runner.devices,
            self.executor.name,
        )

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(self.heartbeat_interval):
            running = {r.attempt_id: r for r in self._running()}
            try:
                answer = self.client.heartbeat(self.worker_id, list(running))
            except ServiceUnavailable as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            except AttemptGone:
                log.warning("heartbeat: the service does not know this worker; registering again")
                with contextlib.suppress(ServiceUnavailable):
                    self._register()
                continue
            except Exception:
                log.exception("heartbeat failed")
                continue
            for attempt_id in answer.cancel:
                runner = running.get(str(attempt_id))
                if runner is not None:
                    log.info("attempt %s: the service asks to stop it", attempt_id)
                    runner.cancel("asked by the service")

    def _recover(self) -> None:
        """Ship what runs of an earlier life of this agent left on disk, and finish those that ended.

        A run whose torchrun exited (or whose result.json says it succeeded) before 'finish' was
        delivered is reported now (409 if the service already ended the attempt); the others
        end by lease expiry. Only this agent's runs (agents may share a runs directory), and only those of
        the database it registered with: another database's attempt ids name other attempts here.
        """
        runs = Path(database_runs(self.inventory.runs_dir, self.database))
        for run_dir, attempt in rundir.unfinished_runs(runs, self.name):
            attempt_id = str(attempt.get("attempt_id"))
            with self._lock:
                if attempt_id in self.runners:
                    continue
            log.info("recovering run %s (attempt %s): shipping what is left", run_dir, attempt_id)
            try:
                RunShipper(run_dir, attempt_id, self.client).drain()
            except AttemptGone:
                pass
            except (ServiceUnavailable, ShippingRefused):
                return
            outcome = recovered_outcome(run_dir, attempt)
            if outcome is None:
                rundir.set_state(run_dir, "abandoned")
            else:
                send_finish(self.client, attempt_id, run_dir, outcome)


def recovered_outcome(run_dir: Path, attempt: dict[str, Any]) -> Outcome | None:
    """How an earlier agent's run ended, when the run directory says so; None: unknown (the lease decides)."""
    result = rundir.read_json(run_dir / RESULT_FILE)
    exit_code = attempt.get("exit_code")
    if not isinstance(exit_code, int):
        if result is None or result.get("status") != "succeeded":
            return None
        exit_code = 0  # rank 0 writes result.json last; the agent died before torchrun's exit was seen
    return classify_exit(exit_code, result, rundir.log_tail(run_dir))


def run_agent(
    settings: AgentSettings,
    inventory: WorkerInventory | None = None,
    make_executor: Callable[[Agent], Executor] | None = None,
) -> None:
    """Run a worker until SIGTERM; `make_executor` puts its attempts elsewhere (worker/executors/)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s flightdeck-agent %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the agent's own
    silence_known_noise()  # host preflight imports transformers
    # Relative paths the libraries resolve themselves (a hub id that is also a directory name) resolve
    # against the workspace, never against wherever the agent was started.
    os.chdir(settings.workspace)
    agent = Agent(settings, inventory)
    if make_executor is not None:
        agent.executor = make_executor(agent)
    agent.install_signal_handlers()
    try:
        agent.run()
    except ServiceRefused as exc:
        # A wrong token or URL never heals by retrying: say so and stop.
        log.error("the service refused this worker: %s (check --token and --service)", exc)
        raise SystemExit(2) from None
    except ServiceUnavailable as exc:
        if not agent.stop.is_set():
            raise
        # Stopped while the service had not answered yet (the first registration retries until then).
        log.info("stopped before the service answered: %s", exc)
