"""An attempt's nodes (every attempt has them: one worker's attempt is a gang of one): which worker
holds which node, why the others must stop, and the attempt's end once every node has ended (as one
attempt; when the nodes are several workers', the node that caused it named).

A worker holds one node of an attempt, or every node of it when its scheduler places them (Slurm):
(attempt, worker) names the worker's share, which heartbeats renew and its finish report ends."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, func, select

from flightdeck.contracts import FinishReport
from flightdeck.service.core.sql import json_value
from flightdeck.service.core.tables import attempt_nodes, workers
from flightdeck.service.lifecycle import change_nodes
from flightdeck.statuses import NODE_ACTIVE, NODE_ENDED, NodeStatus


def held_statuses(conn: Connection, attempt_id: int, worker_id: int) -> list[str]:
    """The statuses of the worker's nodes of the attempt, by rank (empty: it holds none)."""
    return list(
        conn.execute(
            select(attempt_nodes.c.status)
            .where(attempt_nodes.c.attempt_id == attempt_id, attempt_nodes.c.worker_id == worker_id)
            .order_by(attempt_nodes.c.node_rank)
        ).scalars()
    )


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


def finish_node(
    conn: Connection, attempt_id: int, worker_id: int, report: FinishReport, now: float
) -> str | None:
    """Record the end of the worker's node(s); their status before (the first active one's; None: the
    worker holds no node of the attempt). AttemptNotRunning is the caller's to raise."""
    held = held_statuses(conn, attempt_id, worker_id)
    active = [s for s in held if s in NODE_ACTIVE]
    if active:
        change_nodes(
            conn,
            and_(attempt_nodes.c.attempt_id == attempt_id, attempt_nodes.c.worker_id == worker_id),
            sorted({NodeStatus(s) for s in active}),
            NodeStatus(report.status),
            {"finished_at": now, "lease_expires_at": None, "report": report.model_dump(mode="json")},
        )
    first = active or held
    return first[0] if first else None


def outcome(conn: Connection, attempt_id: int) -> FinishReport | None:
    """The attempt's end once every node has ended (None before), caused by a lost node (its peers then
    fail or are stopped because it is gone), else the failed node with a catalog code (the trainer's own
    finding), else the first failed one; else cancelled if a node was; else node 0's success (it holds
    the result). The cause's node is named when the nodes are several workers' (one worker's report is
    the attempt's as it sent it)."""
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
        if len({n.worker_id for n in nodes}) == 1:
            return report
        prefix = f"node {cause.node_rank} ({cause.worker_name}): "
        return report.model_copy(update={"message": prefix + (report.message or cause.status)})
    return FinishReport.model_validate(json_value(nodes[0].report))


def holds_node(conn: Connection, attempt_id: int, worker_id: int, rank: int | None = None) -> int | None:
    """The node rank the worker holds in the attempt: `rank` if it holds that one, else its first
    (None: it holds none, or not `rank`)."""
    n = attempt_nodes.c
    held = and_(n.attempt_id == attempt_id, n.worker_id == worker_id)
    if rank is not None:
        held = and_(held, n.node_rank == rank)
    found: int | None = conn.execute(select(func.min(n.node_rank)).where(held)).scalar_one()
    return found
