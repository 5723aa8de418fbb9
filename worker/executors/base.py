"""The executor interface: submit a claimed attempt, poll it, cancel it.

The agent's claim loop, heartbeats and cancels talk only to this interface. Each executor brings its
own source of liveness (a thread's `done` for the in-process runner, the scheduler's job state for
Slurm) and reports the end through the same finish call as the runner itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from flightdeck.contracts import ClaimedAttempt
    from flightdeck.inventory import WorkerInventory
    from flightdeck.worker.agent.client import WorkerClient


@dataclass(frozen=True)
class ExecutorSetup:
    """What every executor takes from its agent, built once by the agent (`Agent.executor_setup`)."""

    client: WorkerClient
    inventory: WorkerInventory
    stop: threading.Event
    agent_name: str
    cancel_grace: float = 10.0
    allowed_roots: tuple[Path, ...] = ()
    scripts_dir: Path | None = None
    # Called when an attempt ends, so the claim loop looks for work at once.
    on_done: Callable[[], None] = lambda: None


class Execution(Protocol):
    """One submitted attempt, as the agent tracks it."""

    attempt_id: str
    job_id: str
    # Set once the attempt has ended and its end was reported (or left to the lease).
    done: threading.Event

    @property
    def devices(self) -> list[int]:
        """The worker's device indices (or CPU slots) the attempt holds until it ends, on each node."""
        ...

    @property
    def nodes(self) -> int:
        """How many of the worker's nodes the attempt holds (1 but on a worker of several nodes)."""
        ...

    def poll(self) -> str:
        """Where the attempt stands, in the executor's own words (e.g. `running`, `PENDING (Resources)`)."""
        ...

    def cancel(self, reason: str) -> None:
        """Ask the attempt to stop; `done` is set once nothing of it is left."""
        ...


class Executor(Protocol):
    """Starts claimed attempts somewhere; `submit` returns at once."""

    name: str

    def submit(self, attempt: ClaimedAttempt) -> Execution: ...


class SavedWorker(Protocol):
    worker_id: str
    token: str


@runtime_checkable
class AdoptingExecutor(Protocol):
    """An executor whose attempts outlive it (a scheduler runs them): restarted, its worker registers
    again as itself, with the attempts it still holds, and the executor watches them again."""

    def saved_identity(self) -> SavedWorker | None:
        """The worker id and own token of this worker's earlier life, if it saved one."""
        ...

    def remember_identity(self, worker_id: str, token: str, heartbeat_interval: float, database: str) -> None:
        """Called after every registration: the worker as the service now knows it (`database`: the id
        of the service's database, whose folder of the runs directory holds its attempts)."""
        ...

    def held_attempts(self) -> list[str]:
        """Attempts an earlier life submitted and never saw end."""
        ...

    def adopt(self, keep: list[str], stop: list[str]) -> list[Execution]:
        """Watch `keep` again; stop `stop` (the service no longer runs them here)."""
        ...
