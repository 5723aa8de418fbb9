"""Each node of an attempt holds its own lease, renewed by its worker's heartbeat (every attempt has
nodes, and theirs are the only leases); a node whose lease ran out is lost."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, select, update

from flightdeck.contracts import FinishReport
from flightdeck.service.core.tables import attempt_nodes
from flightdeck.service.lifecycle import change_nodes
from flightdeck.statuses import NODE_ACTIVE, NodeStatus

_ACTIVE = sorted(s.value for s in NODE_ACTIVE)


def attempts_with_expired_nodes(db: Any, now: float) -> list[int]:
    """Attempts with a node whose lease ran out (its agent is gone)."""
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


def renew_node(conn: Connection, attempt_id: int, worker_id: int, until: float) -> int:
    """Renew the worker's live nodes of the attempt; how many it holds (0: none, or all ended)."""
    done = conn.execute(
        update(attempt_nodes)
        .where(
            attempt_nodes.c.attempt_id == attempt_id,
            attempt_nodes.c.worker_id == worker_id,
            attempt_nodes.c.status.in_(_ACTIVE),
        )
        .values(lease_expires_at=until)
    )
    return int(done.rowcount)


def set_node_leases(conn: Connection, until: float, worker_id: int | None = None) -> None:
    """Every active node's lease (or those of one worker) now ends at `until`: a full lease after the
    service restarts, or the past for a revoked worker, whose nodes the reaper then marks lost."""
    c = attempt_nodes.c
    where = (
        c.status.in_(_ACTIVE) if worker_id is None else and_(c.status.in_(_ACTIVE), c.worker_id == worker_id)
    )
    conn.execute(update(attempt_nodes).where(where).values(lease_expires_at=until))
