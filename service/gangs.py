"""Multi-node jobs: N workers gather in a gang, become the N nodes of one attempt, and end it together.

The life of a job with `resources.nodes: N` (rows of attempt_nodes, one per worker):
1. gather: a worker whose claim picks the job joins its gang (`waiting`, until now + gang_wait). The
   job stays queued, so the next worker's claim picks it too. A job is not joined while fewer than N
   workers are alive: nothing could fill it, and the worker takes the next job instead.
2. fill: the claim that brings the N-th live member creates the attempt, gives node ranks in join order,
   builds each node's plan (static rendezvous at node 0's registered address) and moves the job to
   running. The members still long-polling get their node from their next claim (`assigned` ->
   `running`); the claim route wakes them.
3. release: a member whose gang has not filled by its `until` is released and skips that job for
   another gang_wait, so single-node jobs behind it run and the worker is never held for good.
4. start together: each node's agent runs host preflight and reports ready (node 0 with the port it
   found free); torchrun starts on a node only when every node is ready (`ready_state`).
5. end together: each node reports its own finish. A node that failed, was cancelled or lost its lease
   makes the heartbeat stop every other node; the attempt ends once every node has ended, as one
   attempt, with the first failed node's cause (its rank and worker named).

A worker holds at most one node of an attempt, so (attempt, worker) names a node.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, bindparam, func, insert, select, update

from service.contracts import ClaimedAttempt, FinishReport, NodeStart, claimed_attempt
from service.core.sql import json_value, run_compiled
from service.core.tables import attempt_nodes, attempts, jobs, workers
from service.inventory import WorkerInventory
from service.launch.plan import build_launch_plan
from service.lifecycle import (
    NEW_ATTEMPT,
    StatusChanged,
    change_nodes,
    change_statuses,
    fail_unlaunchable,
    running,
)
from service.recipe import Recipe
from service.statuses import NODE_ACTIVE, NODE_ENDED, AttemptStatus, JobStatus, NodeStatus

_ACTIVE = sorted(s.value for s in NODE_ACTIVE)


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
    live_since = now - lease_seconds
    c = attempt_nodes.c
    members = conn.execute(
        select(c.id, c.worker_id, c.devices, workers.c.name, workers.c.inventory)
        .join(workers, workers.c.id == c.worker_id)
        .where(
            c.job_id == job_id,
            c.status == NodeStatus.waiting.value,
            c.until > now,
            workers.c.last_seen_at > live_since,
            workers.c.token_hash.is_not(None),
        )
        .order_by(c.joined_at, c.id)
        .limit(needed)
    ).all()
    if len(members) < needed:
        return None
    inventories = [WorkerInventory.model_validate(json_value(m.inventory)) for m in members]
    order = rendezvous_order(inventories)
    if order is None:
        _fail_unreachable(conn, job_id, [m.name for m in members], inventories, now, gang_wait)
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
            lease_expires_at=None,  # each node has its own lease; the attempt ends when they all have
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
        attempt_id, job_id, number, effective, plans[mine], lease_seconds, (mine, needed, master)
    )


def rendezvous_order(inventories: list[WorkerInventory]) -> list[int] | None:
    """Join order, with node 0 moved to the first member whose address the others can reach (N001);
    None when there is none. Members all on one host reach each other on any address, loopback too."""
    if len({inv.hostname for inv in inventories}) == 1:
        return list(range(len(inventories)))
    reachable = [i for i, inv in enumerate(inventories) if not _local_only(inv.address)]
    if not reachable:
        return None
    return [reachable[0], *(i for i in range(len(inventories)) if i != reachable[0])]


def _local_only(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address in ("", "localhost")  # a host name: the other hosts resolve it (not checked here)
    return ip.is_loopback or ip.is_unspecified or ip.is_link_local


def _fail_unreachable(
    conn: Connection,
    job_id: int,
    names: list[str],
    inventories: list[WorkerInventory],
    now: float,
    gang_wait: float,
) -> None:
    """N001: the gang spans hosts and no member registered an address the others can reach."""
    seen = ", ".join(
        f"{name} ({inv.hostname}: {inv.address})" for name, inv in zip(names, inventories, strict=True)
    )
    message = (
        f"N001: the nodes are on different hosts and none registered an address the others can reach "
        f"({seen}); torchrun's rendezvous would wait for peers that never arrive"
    )
    change_nodes(
        conn,
        attempt_nodes.c.job_id == job_id,
        [NodeStatus.waiting],
        NodeStatus.released,
        {"until": now + gang_wait},
    )
    fail_unlaunchable(
        conn,
        job_id,
        code="N001",
        message=message,
        fix="start each worker with --address (FLIGHTDECK_WORKER_ADDRESS) set to an address of its host "
        "that the other hosts reach, then submit the job again",
        now=now,
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
        select(attempts.c.job_id, attempts.c.number, attempts.c.nnodes, jobs.c.effective_recipe)
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
    )


def undeliver(conn: Connection, attempt_id: int, worker_id: int) -> None:
    """The claim's answer never reached the agent: the node is handed over on its next claim."""
    change_nodes(
        conn,
        and_(attempt_nodes.c.attempt_id == attempt_id, attempt_nodes.c.worker_id == worker_id),
        [NodeStatus.running],
        NodeStatus.assigned,
    )


def live_workers(conn: Connection, now: float, lease_seconds: float) -> int:
    return int(
        conn.execute(
            select(func.count())
            .select_from(workers)
            .where(workers.c.last_seen_at > now - lease_seconds, workers.c.token_hash.is_not(None))
        ).scalar_one()
    )


# --- a filled gang's nodes: readiness, stopping together, ending together -------------------------


def node_of(conn: Connection, attempt_id: int, worker_id: int) -> Any:
    """The node row (attempt, worker), or None when the worker holds no node of the attempt."""
    return conn.execute(
        select(attempt_nodes).where(
            attempt_nodes.c.attempt_id == attempt_id, attempt_nodes.c.worker_id == worker_id
        )
    ).first()


def nodes_of(conn: Connection, attempt_id: int) -> list[Any]:
    return list(
        conn.execute(
            select(attempt_nodes, workers.c.name.label("worker_name"))
            .join(workers, workers.c.id == attempt_nodes.c.worker_id)
            .where(attempt_nodes.c.attempt_id == attempt_id)
            .order_by(attempt_nodes.c.node_rank)
        ).all()
    )


def stopping_reason(nodes: list[Any]) -> str | None:
    """Why the other nodes must stop: the first node that ended without succeeding, named; else None."""
    ended = sorted(
        (n for n in nodes if n.status in NODE_ENDED and n.status != NodeStatus.succeeded),
        key=lambda n: (n.finished_at or 0.0, n.node_rank),
    )
    if not ended:
        return None
    first = ended[0]
    return f"node {first.node_rank} ({first.worker_name}) {first.status}"


class SingleNode(LookupError):
    """The attempt has no nodes to wait for (the API answers 409)."""


def mark_ready(conn: Connection, attempt_id: int, worker_id: int, port: int | None, now: float) -> None:
    values: dict[str, Any] = {"ready_at": now}
    if port is not None:
        values["port"] = port
    conn.execute(
        update(attempt_nodes)
        .where(
            attempt_nodes.c.attempt_id == attempt_id,
            attempt_nodes.c.worker_id == worker_id,
            attempt_nodes.c.ready_at.is_(None),
        )
        .values(values)
    )


def ready_state(conn: Connection, attempt_id: int) -> NodeStart:
    """Whether every node passed host preflight (node 0 with its port), or why the attempt stops."""
    nodes = nodes_of(conn, attempt_id)
    if not nodes:
        raise SingleNode(f"attempt {attempt_id} runs on one node: it starts without waiting for others")
    status, job_status = conn.execute(
        select(attempts.c.status, jobs.c.status)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(attempts.c.id == attempt_id)
    ).one()
    abort = stopping_reason(nodes)
    if abort is None and status != AttemptStatus.running:
        abort = f"the attempt is {status}"
    if abort is None and job_status == JobStatus.cancelling.value:
        abort = "the job is being cancelled"
    first = nodes[0]
    waiting = [n.node_rank for n in nodes if n.ready_at is None]
    return NodeStart(
        start=abort is None and not waiting and first.port is not None,
        abort=abort,
        master_addr=first.address,
        master_port=first.port,
        waiting_for=waiting,
    )


def finish_node(conn: Connection, attempt_id: int, worker_id: int, report: FinishReport, now: float) -> str:
    """Record one node's end; the node's status before (AttemptNotRunning is the caller's to raise)."""
    node = node_of(conn, attempt_id, worker_id)
    assert node is not None
    if node.status in NODE_ACTIVE:
        change_nodes(
            conn,
            attempt_nodes.c.id == node.id,
            [NodeStatus(node.status)],
            NodeStatus(report.status),
            {"finished_at": now, "lease_expires_at": None, "report": report.model_dump(mode="json")},
        )
    return str(node.status)


def outcome(conn: Connection, attempt_id: int) -> FinishReport | None:
    """The attempt's end once every node has ended (None before), with the node that caused it named:
    a lost node (its peers then fail or are stopped because it is gone), else the failed node with a
    catalog code (the trainer's own finding), else the first failed one; else cancelled if a node was;
    else node 0's success (it holds the result)."""
    nodes = nodes_of(conn, attempt_id)
    if any(n.status not in NODE_ENDED for n in nodes):
        return None
    by_time = sorted(nodes, key=lambda n: (n.finished_at or 0.0, n.node_rank))
    lost = [n for n in by_time if n.status == NodeStatus.lost]
    failed = [n for n in by_time if n.status == NodeStatus.failed]
    coded = [n for n in failed if (json_value(n.report) or {}).get("failure_code")]
    cancelled = [n for n in by_time if n.status == NodeStatus.cancelled]
    cause = next(iter(lost + coded + failed + cancelled), None)
    if cause is not None:
        report = FinishReport.model_validate(json_value(cause.report))
        prefix = f"node {cause.node_rank} ({cause.worker_name}): "
        return report.model_copy(update={"message": prefix + (report.message or cause.status)})
    return FinishReport.model_validate(json_value(nodes[0].report))


def attempts_with_expired_nodes(db: Any, now: float) -> list[int]:
    """Multi-node attempts with a node whose lease ran out (its agent is gone)."""
    c = attempt_nodes.c
    with db.reading() as conn:
        return [
            row[0]
            for row in conn.execute(
                select(c.attempt_id).distinct().where(c.status.in_(_ACTIVE), c.lease_expires_at < now)
            )
        ]


def expire_nodes(conn: Connection, attempt_id: int, now: float, report: FinishReport) -> None:
    """The attempt's nodes whose lease ran out become `lost`, with the cause as their report."""
    c = attempt_nodes.c
    change_nodes(
        conn,
        and_(c.attempt_id == attempt_id, c.lease_expires_at < now),
        NODE_ACTIVE,
        NodeStatus.lost,
        {"finished_at": now, "lease_expires_at": None, "report": report.model_dump(mode="json")},
    )


def renew_node(conn: Connection, attempt_id: int, worker_id: int, until: float) -> None:
    conn.execute(
        update(attempt_nodes)
        .where(
            attempt_nodes.c.attempt_id == attempt_id,
            attempt_nodes.c.worker_id == worker_id,
            attempt_nodes.c.status.in_(_ACTIVE),
        )
        .values(lease_expires_at=until)
    )


def set_node_leases(conn: Connection, until: float, worker_id: int | None = None) -> None:
    """Every active node's lease (or those of one worker) now ends at `until`: a full lease after the
    service restarts, or the past for a revoked worker, whose nodes the reaper then marks lost."""
    c = attempt_nodes.c
    where = (
        c.status.in_(_ACTIVE) if worker_id is None else and_(c.status.in_(_ACTIVE), c.worker_id == worker_id)
    )
    conn.execute(update(attempt_nodes).where(where).values(lease_expires_at=until))


def holds_node(conn: Connection, attempt_id: int, worker_id: int) -> int | None:
    """The node rank the worker holds in the attempt (None: none)."""
    return conn.execute(
        select(attempt_nodes.c.node_rank).where(
            and_(attempt_nodes.c.attempt_id == attempt_id, attempt_nodes.c.worker_id == worker_id)
        )
    ).scalar_one_or_none()
