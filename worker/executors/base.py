"""The executor interface: submit a claimed attempt, poll it, cancel it.

The agent's claim loop, heartbeats and cancels talk only to this interface. Each executor brings its
own source of liveness (a thread's `done` for the in-process runner, the scheduler's job state for
Slurm) and reports the end through the same finish call as the runner itself.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol


class Execution(Protocol):
    """One submitted attempt, as the agent tracks it."""

    attempt_id: str
    job_id: str
    # Set once the attempt has ended and its end was reported (or left to the lease).
    done: threading.Event

    @property
    def devices(self) -> list[int]:
        """The worker's device indices (or CPU slots) the attempt holds until it ends."""
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

    def submit(self, attempt: dict[str, Any]) -> Execution: ...
