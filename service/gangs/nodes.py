"""A filled gang's nodes: which worker holds which node, why the others must stop, and the attempt's
end once every node has ended (as one attempt, the node that caused it named)."""

from __future__ import annotations

from typing import Any

from flightdeck.service.contracts import FinishReport
from flightdeck.service.core.sql import json_value
from flightdeck.service.core.tables import attempt_nodes, workers
from flightdeck.service.lifecycle import change_nodes
from flightdeck.service.statuses import NODE_ACTIVE, NODE_ENDED, NodeStatus
from sqlalchemy import Connection, and_, select


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


def holds_node(conn: Connection, attempt_id: int, worker_id: int) -> int | None:
    """The node rank the worker holds in the attempt (None: none)."""
    return conn.execute(
        select(attempt_nodes.c.node_rank).where(
            and_(attempt_nodes.c.attempt_id == attempt_id, attempt_nodes.c.worker_id == worker_id)
        )
    ).scalar_one_or_none()
