"""Workers joining: registration (each worker's own token; a live worker's name is never taken over)
and revocation (its token stops working, its attempts are lost as for an expired lease)."""

from __future__ import annotations

import time

from sqlmodel import col, select

from flightdeck.contracts import NameTaken
from flightdeck.inventory import WorkerInventory
from flightdeck.service.core.db import Database
from flightdeck.service.gangs.node_leases import renew_node, set_node_leases
from flightdeck.service.leases import reap_expired_leases
from flightdeck.service.models import Attempt, Worker
from flightdeck.service.worker_identity import new_worker_token
from flightdeck.service.worker_liveness import is_alive
from flightdeck.statuses import AttemptStatus


class NotThisWorker(Exception):
    """The caller's token belongs to another worker."""


def register_worker(
    db: Database,
    name: str,
    inventory: WorkerInventory,
    *,
    caller: int | None,
    lease_seconds: float,
    keep_token: bool = False,
) -> tuple[Worker, str]:
    """Register (or refresh) a worker and issue its own token: (worker, token), the token shown once.

    `caller` is the worker the request authenticated as (None: the enrolment token). A worker may
    re-register itself (its token is replaced). The enrolment token takes a name that is free, revoked,
    or held by a worker silent for longer than a lease (a restarted agent); a live worker's name is
    never taken over. `keep_token`: a worker re-registering itself keeps its token (the answer's token
    is then empty: the caller already holds it).
    """
    now = time.time()
    token, token_hash = ("", None) if keep_token and caller is not None else new_worker_token()
    with db.write() as session:
        worker = session.exec(select(Worker).where(Worker.name == name)).first()
        if caller is not None and (worker is None or worker.id != caller):
            raise NotThisWorker(f"this token belongs to worker {caller}, not to '{name}'")
        live = worker is not None and is_alive(worker, now, lease_seconds)
        if caller is None and live:
            raise NameTaken(
                f"worker '{name}' is registered and alive; register under another name, or revoke it first "
                f"(flightdeck workers revoke {name})"
            )
        if worker is None:
            worker = Worker(name=name, inventory={}, registered_at=now, last_seen_at=now)
        worker.inventory = inventory.model_dump(mode="json")
        worker.last_seen_at = now
        if token_hash is not None:
            worker.token_hash = token_hash
        session.add(worker)
        session.flush()
    return worker, token


def adopt_held_attempts(db: Database, worker_id: int, held: list[int], lease_seconds: float) -> list[int]:
    """A restarted worker's attempts that its scheduler still runs: each the service still has running
    on this worker gets a full lease at once (the reaper would otherwise end it before the first
    heartbeat); the others (ended, requeued meanwhile, or never this worker's) are returned, to stop."""
    if not held:
        return []
    until = time.time() + lease_seconds
    with db.write() as session:
        running = session.exec(
            select(Attempt.id).where(col(Attempt.id).in_(held), Attempt.status == AttemptStatus.running)
        ).all()
        conn = session.connection()
        # The nodes hold the leases: an attempt is this worker's while it holds a live node of it
        # (a scheduler's job of several nodes is one attempt whose nodes are all this worker's).
        adopted = {
            attempt_id
            for attempt_id in running
            if attempt_id is not None and renew_node(conn, attempt_id, worker_id, until) > 0
        }
    return sorted(set(held) - adopted)


def revoke_worker(db: Database, worker_id: int) -> Worker | None:
    """The worker's token stops working; its running attempts are lost as for an expired lease."""
    now = time.time()
    with db.write() as session:
        worker = session.get(Worker, worker_id)
        if worker is None:
            return None
        worker.token_hash = None
        session.add(worker)
        set_node_leases(session.connection(), now - 1, worker_id=worker_id)
    reap_expired_leases(db, now)
    return worker
