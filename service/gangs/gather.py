"""A gang gathering: workers join a multi-node job's gang, the N-th live member fills it (the attempt,
node ranks, each node's plan), a member whose gang did not fill in time is released, and a member's
node is handed to its agent by its next claim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, bindparam, insert, select

from flightdeck.contracts import ClaimedAttempt, claimed_attempt
from flightdeck.inventory import WorkerInventory
from flightdeck.launch.plan import build_launch_plan
from flightdeck.recipe import Recipe
from flightdeck.service.core.sql import json_value, run_compiled
from flightdeck.service.core.tables import attempt_nodes, attempts, jobs, workers
from flightdeck.service.gangs.rendezvous import fail_unreachable, rendezvous_order
from flightdeck.service.lifecycle import NEW_ATTEMPT, StatusChanged, change_nodes, change_statuses, running
from flightdeck.service.worker_liveness import alive
from flightdeck.statuses import NodeStatus


@dataclass
class GangState:
    """What the worker's earlier joins mean for this claim."""

    delivered: ClaimedAttempt | None = None  # a node of a filled gang: the claim's answer
    waiting: bool = False  # still in a gang that may fill: the claim takes nothing else
    skipped: tuple[int, ...] = ()  # jobs whose gang released this worker lately


def gang_state(
    conn: Connection, worker_id: int, now: float, lease_seconds: float, gang_wait: float
) -> GangState:
    """The worker's gang rows, acted on: deliver an assigned node, release an overdue wait."""
    rows = run_compiled(conn, _MINE, {"worker_id": worker_id}).rows
    state = GangState()
    skipped = []
    for node_id, job_id, attempt_id, status, until in rows:
        if status == NodeStatus.assigned and state.delivered is None:
            state.delivered = _deliver(conn, node_id, attempt_id, now, lease_seconds)
        elif status == NodeStatus.waiting and until is not None and until > now:
            state.waiting = True
        elif status == NodeStatus.waiting:
            change_nodes(
                conn,
                attempt_nodes.c.id == node_id,
                [NodeStatus.waiting],
                NodeStatus.released,
                {"until": now + gang_wait},
            )
            skipped.append(job_id)
        elif status == NodeStatus.released and until is not None and until > now:
            skipped.append(job_id)
    state.skipped = tuple(skipped)
    return state


def in_gang(worker_id: Any) -> Any:
    """Whether the worker has gang rows gang_state acts on (a column for the claim's worker lookup)."""
    return (
        select(attempt_nodes.c.id)
        .where(attempt_nodes.c.worker_id == worker_id, attempt_nodes.c.status.in_(_ACTED_ON))
        .exists()
    )


_ACTED_ON = (NodeStatus.waiting.value, NodeStatus.assigned.value, NodeStatus.released.value)
_MINE = select(
    attempt_nodes.c.id,
    attempt_nodes.c.job_id,
    attempt_nodes.c.attempt_id,
    attempt_nodes.c.status,
    attempt_nodes.c.until,
).where(
    attempt_nodes.c.worker_id == bindparam("worker_id", None),
    attempt_nodes.c.status.in_(_ACTED_ON),
)


def join_gang(
    conn: Connection,
    *,
    job_id: int,
    number: int,
    started_at: float | None,
    recipe: Recipe,
    effective: dict[str, Any],
    worker_id: int,
    devices: list[int],
    now: float,
    lease_seconds: float,
    gang_wait: float,
    database: str,
) -> ClaimedAttempt | None:
    """Join the job's gang; the claim's answer when this join fills it, None while it gathers."""
    needed = recipe.resources.nodes
    conn.execute(
        insert(attempt_nodes).values(
            job_id=job_id,
            worker_id=worker_id,
            status=NodeStatus.waiting.value,
            devices=devices,
            joined_at=now,
            until=now + gang_wait,
        )
    )
    c = attempt_nodes.c
    members = conn.execute(
        select(c.id, c.worker_id, c.devices, workers.c.name, workers.c.inventory)
        .join(workers, workers.c.id == c.worker_id)
        .where(
            c.job_id == job_id,
            c.status == NodeStatus.waiting.value,
            c.until > now,
            alive(now, lease_seconds),
        )
        .order_by(c.joined_at, c.id)
        .limit(needed)
    ).all()
    if len(members) < needed:
        return None
    inventories = [WorkerInventory.model_validate(json_value(m.inventory)) for m in members]
    order = rendezvous_order(inventories)
    if order is None:
        fail_unreachable(conn, job_id, [m.name for m in members], inventories, now, gang_wait)
        return None
    members = [members[i] for i in order]
    inventories = [inventories[i] for i in order]
    master = inventories[0].address
    plans = [
        build_launch_plan(
            recipe,
            inventory,
            job_id=job_id,
            attempt_number=number,
            devices=json_value(member.devices),
            database=database,
            node_rank=rank,
            master_addr=master,
        ).model_dump(mode="json")
        for rank, (member, inventory) in enumerate(zip(members, inventories, strict=True))
    ]
    attempt_id = conn.execute(
        insert(attempts)
        .values(
            job_id=job_id,
            number=number,
            worker_id=members[0].worker_id,
            status=NEW_ATTEMPT.value,
            started_at=now,
            nnodes=needed,
            plan=plans[0],
            findings=[],
        )
        .returning(attempts.c.id)
    ).scalar_one()
    mine = None
    for rank, (member, inventory) in enumerate(zip(members, inventories, strict=True)):
        is_mine = member.worker_id == worker_id
        filled = change_nodes(
            conn,
            attempt_nodes.c.id == member.id,
            [NodeStatus.waiting],
            NodeStatus.running if is_mine else NodeStatus.assigned,
            {
                "attempt_id": attempt_id,
                "node_rank": rank,
                "address": inventory.address,
                "until": None,
                "lease_expires_at": now + lease_seconds,
                "plan": plans[rank],
            },
        )
        if filled != 1:
            raise StatusChanged(f"worker {member.worker_id} no longer waits in job {job_id}'s gang")
        if is_mine:
            mine = rank
    names = ", ".join(f"{rank}: {m.name}" for rank, m in enumerate(members))
    change_statuses(
        conn,
        [
            running(
                job_id,
                attempt_id=attempt_id,
                number=number,
                started_at=started_at or now,
                worker_name=members[0].name,
                message=f"attempt {number} claimed by a gang of {needed} workers (node ranks {names})",
            )
        ],
        now,
    )
    if mine is None:  # a live member ahead of this worker filled the gang without it: it waits on
        return None
    return claimed_attempt(
        attempt_id,
        job_id,
        number,
        effective,
        plans[mine],
        lease_seconds,
        (mine, needed, master),
        claimed_at=now,
        job_started_at=started_at or now,
    )


def _deliver(
    conn: Connection, node_id: int, attempt_id: int, now: float, lease_seconds: float
) -> ClaimedAttempt:
    """The claim answer for an assigned node, which now runs (its lease starts afresh)."""
    delivered = change_nodes(
        conn,
        attempt_nodes.c.id == node_id,
        [NodeStatus.assigned],
        NodeStatus.running,
        {"lease_expires_at": now + lease_seconds},
    )
    if delivered != 1:
        raise StatusChanged(f"node {node_id} is no longer assigned; it was not delivered")
    node = conn.execute(
        select(attempt_nodes.c.node_rank, attempt_nodes.c.plan).where(attempt_nodes.c.id == node_id)
    ).one()
    attempt = conn.execute(
        select(
            attempts.c.job_id,
            attempts.c.number,
            attempts.c.nnodes,
            attempts.c.started_at,
            jobs.c.started_at.label("job_started_at"),
            jobs.c.effective_recipe,
        )
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(attempts.c.id == attempt_id)
    ).one()
    master = conn.execute(
        select(attempt_nodes.c.address).where(
            attempt_nodes.c.attempt_id == attempt_id, attempt_nodes.c.node_rank == 0
        )
    ).scalar_one()
    return claimed_attempt(
        attempt_id,
        attempt.job_id,
        attempt.number,
        json_value(attempt.effective_recipe),
        json_value(node.plan),
        lease_seconds,
        (node.node_rank, attempt.nnodes, master),
        claimed_at=attempt.started_at,
        job_started_at=attempt.job_started_at or attempt.started_at,
    )


def undeliver(conn: Connection, attempt_id: int, worker_id: int) -> None:
    """The claim's answer never reached the agent: the node is handed over on its next claim."""
    change_nodes(
        conn,
        and_(attempt_nodes.c.attempt_id == attempt_id, attempt_nodes.c.worker_id == worker_id),
        [NodeStatus.running],
        NodeStatus.assigned,
    )
