"""The attempt runner on its own: `python -m flightdeck.worker.agent.run_attempt DESCRIPTION.json`.

Any executor can start it where the attempt should run (a Slurm allocation's node, a container): it
does what the agent's in-process runner does (host check, environment, process tree, shipping,
classification, finish) from a description file, and talks to the service as the worker that claimed
the attempt. The worker's token comes from the environment (FLIGHTDECK_WORKER_TOKEN), never from argv
or the file: both are readable by other users of a shared host.

SIGTERM/SIGINT (what `scancel`, a time limit or a preemption send) stop every process of the attempt
and end the runner WITHOUT a finish report: only whoever sent the signal knows why (a cancel, a time
limit, a preemption), so the executor that started the runner reports the end with that cause. With
checkpoints on, the trainer is first asked for a checkpoint (SIGUSR1) and given the cancel grace.
SIGUSR1 (Slurm's warning ahead of a time limit or preemption, which the batch script forwards to the
first node's runner) is passed on to the trainer's ranks alone: they save a checkpoint and stop, and
the attempt ends `interrupted` (G017), which is retried.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from flightdeck.contracts import ClaimedAttempt
from flightdeck.inventory import WorkerInventory
from flightdeck.worker.agent import rundir
from flightdeck.worker.agent.attempt import AttemptRunner
from flightdeck.worker.agent.client import AttemptGone, ServiceRefused, ServiceUnavailable, WorkerClient
from flightdeck.worker.agent.outbox import OutboxClient
from flightdeck.worker.log_noise import silence_known_noise
from flightdeck.worker.process_exit import exit_without_teardown
from flightdeck.worker.slurm.allocation import RUNNER_PID_VARIABLE, AllocationError, node_facts
from flightdeck.worker.slurm.commands import SlurmError

TOKEN_VARIABLE = "FLIGHTDECK_WORKER_TOKEN"
log = logging.getLogger("flightdeck.runner")


class AttemptDescription(BaseModel):
    """What a runner needs: the claimed attempt as the service sent it, and where the service is."""

    service_url: str = Field(min_length=1)
    # The claim answer, as the contract has it.
    attempt: ClaimedAttempt
    # The claiming worker's inventory: workspace and runs directory resolve recipe paths (S001).
    inventory: WorkerInventory
    agent_name: str = ""
    allowed_roots: list[str] = []
    scripts_dir: str | None = None
    cancel_grace: float = 10.0
    # "slurm": srun started this runner on one node of a Slurm allocation; it reads its place there
    # (worker/slurm/allocation.py). Empty: the runner is the attempt's only node.
    allocation: Literal["", "slurm"] = ""
    # Set by an executor whose jobs outlive it (Slurm): the runner of node 0 renews the attempt's lease
    # as the claiming worker, so the attempt lives as long as its job does, even while the executor is
    # down or restarting (it finds the job again: worker/slurm/restart_state.py).
    worker_id: str = ""
    heartbeat_interval: float = 10.0
    # The node has no route to the service: the runner writes its events and finish into its run
    # directory and ships nothing; the executor carries them (worker/agent/outbox.py). No token then.
    relay: bool = False


def write_description(path: Path, description: AttemptDescription) -> None:
    """Write the file a runner reads, readable by its owner only (it holds the recipe and plan)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(description.model_dump_json())


def read_description(path: Path) -> AttemptDescription:
    try:
        return AttemptDescription.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"run-attempt: no attempt description at {path}") from None
    except (ValidationError, json.JSONDecodeError) as exc:
        raise SystemExit(f"run-attempt: {path} is not an attempt description: {exc}") from None


def run(description: AttemptDescription, token: str) -> int:
    """Run the attempt to its end and report it (unless stopped by a signal). 0 whatever the outcome on
    an attempt's only node; on a node of a Slurm allocation 1 when it failed, so that `srun
    --kill-on-bad-exit` stops the other nodes at once instead of leaving them in a broken collective."""
    placed = None
    if description.allocation == "slurm":
        try:
            placed = node_facts()
        except (AllocationError, SlurmError) as exc:
            raise SystemExit(f"run-attempt: {exc}") from None
    stop = threading.Event()
    client = WorkerClient(description.service_url, token, stop=stop) if not description.relay else None
    scripts_dir = Path(description.scripts_dir) if description.scripts_dir else None
    runner = AttemptRunner(
        description.attempt,
        client=client if client is not None else OutboxClient(Path()),
        inventory=description.inventory,
        stop=stop,
        cancel_grace=description.cancel_grace,
        allowed_roots=tuple(Path(p) for p in description.allowed_roots),
        scripts_dir=scripts_dir,
        agent_name=description.agent_name,
        placed=placed,
        ships=not description.relay,
    )
    if client is None:  # the node's own run directory is known once the runner has placed it
        runner.client = OutboxClient(runner.run_dir)

    def stop_attempt(signum: int, _frame: Any) -> None:
        log.info("attempt %s: %s; stopping its processes", runner.attempt_id, signal.Signals(signum).name)
        stop.set()

    def checkpoint_attempt(_signum: int, _frame: Any) -> None:
        # Slurm's warning ahead of a time limit or preemption, forwarded by the batch script: passed on
        # to the trainer's ranks (the ranks of every node then agree to save at the next step).
        runner.request_checkpoint()

    if client is not None and description.worker_id and (placed is None or placed.rank == 0):
        threading.Thread(
            target=keep_attempt_lease,
            args=(client, description.worker_id, runner.attempt_id, description.heartbeat_interval, stop),
            name="lease",
            daemon=True,
        ).start()
    signal.signal(signal.SIGTERM, stop_attempt)
    signal.signal(signal.SIGINT, stop_attempt)
    signal.signal(signal.SIGUSR1, checkpoint_attempt)
    pid_file = os.environ.get(RUNNER_PID_VARIABLE)
    if pid_file and (placed is None or placed.rank == 0):
        # The batch shell runs on the first node: it forwards Slurm's warning to this pid.
        Path(pid_file).write_text(str(os.getpid()))
    try:
        runner.run()
    finally:
        if client is not None:
            client.close()
    if stop.is_set() and (runner.run_dir / rundir.ATTEMPT_FILE).exists():
        # Stopped by a signal, by someone who knows why: this node's runner did not die with its node.
        rundir.set_state(runner.run_dir, "stopped")
    failed = runner.outcome is not None and runner.outcome.status == "failed"
    return 1 if placed is not None and placed.nnodes > 1 and failed else 0


def keep_attempt_lease(
    client: WorkerClient, worker_id: str, attempt_id: str, interval: float, stop: threading.Event
) -> None:
    """Heartbeat the attempt while the runner runs. Its cancel orders are the executor's business (it
    cancels through the scheduler, which knows when nothing of the job is left): not acted on here."""
    while not stop.wait(interval):
        try:
            client.heartbeat(worker_id, [attempt_id])
        except (AttemptGone, ServiceUnavailable, ServiceRefused) as exc:
            log.warning("attempt %s: lease not renewed: %s", attempt_id, exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flightdeck.worker.agent.run_attempt", description=__doc__
    )
    parser.add_argument("description", type=Path, help="the attempt description (JSON)")
    args = parser.parse_args(argv)
    # Read and removed at once: the training processes the runner starts never see it.
    token = os.environ.pop(TOKEN_VARIABLE, "")
    description = read_description(args.description)
    if not token and not description.relay:
        raise SystemExit(f"run-attempt: set {TOKEN_VARIABLE} to the claiming worker's token")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s flightdeck-runner %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    silence_known_noise()
    workspace = description.inventory.workspace
    if workspace:
        os.chdir(workspace)  # relative paths resolve against the workspace, as in the agent
    return run(description, token)


if __name__ == "__main__":
    # The finish is reported and every process of the attempt ended: an abort in the interpreter's
    # teardown (a native thread pool of the host check's libraries) would make srun fail the node.
    exit_without_teardown(main())
