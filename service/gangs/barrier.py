"""The start barrier of a multi-node attempt: no node starts torchrun until every node's host passed
preflight and node 0 reported its rendezvous port."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update

from flightdeck.contracts import NodeStart
from flightdeck.service.core.tables import attempt_nodes, attempts, jobs
from flightdeck.service.gangs.nodes import nodes_of, stopping_reason
from flightdeck.statuses import AttemptStatus, JobStatus


class SingleNode(LookupError):
    """The attempt's nodes are one worker's: it has no other nodes to wait for (the API answers 409)."""


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
    if len({n.worker_id for n in nodes}) < 2:
        raise SingleNode(f"attempt {attempt_id} runs on one worker: it starts without waiting for others")
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
