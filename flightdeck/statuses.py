"""The statuses of jobs, attempts and nodes, and the one table per kind that says which changes are
allowed. Pure (no database): the guarded writes that apply these tables are service/lifecycle.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    def is_terminal(self) -> bool:
        return self in TERMINAL_JOB


class AttemptStatus(StrEnum):
    """An attempt is written `running` when claimed (or when its gang fills) and ends once."""

    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    lost = "lost"

    def is_terminal(self) -> bool:
        return self in ATTEMPT_ENDED


class NodeStatus(StrEnum):
    """One worker's row in a multi-node job (service/gangs/): it gathers in the gang (`waiting`), is
    let go when the gang does not fill in time (`released`), becomes a node of the attempt (`assigned`
    until its agent has the claim answer, then `running`) and ends like an attempt."""

    waiting = "waiting"
    released = "released"
    assigned = "assigned"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    lost = "lost"

    def is_terminal(self) -> bool:
        return self in NODE_ENDED


TERMINAL_JOB = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})
ATTEMPT_ENDED = frozenset(
    {AttemptStatus.succeeded, AttemptStatus.failed, AttemptStatus.cancelled, AttemptStatus.lost}
)
# A node in any of these has ended; one in any other than `succeeded` stops its peers.
NODE_ENDED = frozenset({NodeStatus.succeeded, NodeStatus.failed, NodeStatus.cancelled, NodeStatus.lost})
NODE_ACTIVE = frozenset({NodeStatus.assigned, NodeStatus.running})

S = TypeVar("S", bound=StrEnum)


class IllegalTransition(Exception):
    """A status change the lifecycle forbids, above all leaving a terminal status."""


@dataclass(frozen=True)
class Lifecycle(Generic[S]):
    """One kind's statuses and its allowed changes (`allowed[a]`: the statuses an `a` may become; a
    status with no entry is terminal)."""

    kind: str
    status: type[S]
    allowed: Mapping[S, frozenset[S]]

    def check(self, current: S | str, new: S | str) -> S:
        """Return `new` if a row may go from `current` to it; raise IllegalTransition otherwise."""
        old, to = self.status(current), self.status(new)
        targets = self.allowed.get(old)
        if targets is None:
            raise IllegalTransition(
                f"{self.kind} is {old.value}, a terminal status; it cannot become {to.value}"
            )
        if to not in targets:
            raise IllegalTransition(f"a {old.value} {self.kind} cannot become {to.value}")
        return to

    def sources_for(self, new: S | str) -> list[str]:
        """Statuses a row may be in for a change to `new` (the guarded UPDATE's WHERE status IN)."""
        to = self.status(new)
        return [s.value for s, targets in self.allowed.items() if to in targets]

    @classmethod
    def declare(
        cls,
        kind: str,
        status: type[S],
        *,
        ends: frozenset[S],
        ending_from: tuple[S, ...],
        moves: Mapping[S, tuple[S, ...]],
    ) -> Lifecycle[S]:
        """A kind's table from its one declaration: the statuses that end it (`ends`), the live statuses
        that may end in any of them (`ending_from`), and every other change (`moves`)."""
        live = dict.fromkeys([*moves, *ending_from])
        return cls(
            kind,
            status,
            {s: frozenset(moves.get(s, ())) | (ends if s in ending_from else frozenset()) for s in live},
        )


JOB = Lifecycle.declare(
    "job",
    JobStatus,
    ends=TERMINAL_JOB,
    ending_from=(JobStatus.running, JobStatus.cancelling),
    moves={
        # A queued job is never succeeded: only an attempt ends one that way.
        JobStatus.queued: (JobStatus.running, JobStatus.cancelled, JobStatus.failed),
        # running -> queued is a requeue after a lost lease or a retryable failure.
        JobStatus.running: (JobStatus.queued, JobStatus.cancelling),
    },
)

ATTEMPT = Lifecycle.declare(
    "attempt", AttemptStatus, ends=ATTEMPT_ENDED, ending_from=(AttemptStatus.running,), moves={}
)

NODE = Lifecycle.declare(
    "node",
    NodeStatus,
    ends=NODE_ENDED,
    ending_from=(NodeStatus.assigned, NodeStatus.running),
    moves={
        # The gang fills (this worker's claim: running; the others': assigned), or it is let go.
        NodeStatus.waiting: (NodeStatus.assigned, NodeStatus.running, NodeStatus.released),
        # assigned -> running: the agent's next claim delivers the node; running -> assigned: that
        # answer never reached the agent, so the next claim delivers it again.
        NodeStatus.assigned: (NodeStatus.running,),
        NodeStatus.running: (NodeStatus.assigned,),
    },
)


def check_transition(current: JobStatus | str, new: JobStatus | str) -> JobStatus:
    """JOB.check: `new` if a job may go from `current` to it; IllegalTransition otherwise."""
    return JOB.check(current, new)
