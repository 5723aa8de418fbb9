"""When a worker counts as alive: seen within one lease, and not revoked.

`flightdeck workers revoke` withdraws the worker's token at once (token_hash None): its agent's next
call is refused and its attempts are lost as for an expired lease, so it is no longer alive even while
its last heartbeat is within the lease. One rule for the workers list, a queued job's waiting text, the
workers gauge, a name's registration and the gangs' count of who could fill them.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Connection, and_, func, select

from flightdeck.service.core.tables import workers
from flightdeck.service.models import Worker


def is_alive(worker: Worker, now: float, lease_seconds: float) -> bool:
    return worker.token_hash is not None and now - worker.last_seen_at < lease_seconds


def alive(now: float, lease_seconds: float) -> ColumnElement[bool]:
    """`is_alive` as a WHERE clause on the workers table."""
    return and_(workers.c.last_seen_at > now - lease_seconds, workers.c.token_hash.is_not(None))


def count_alive(conn: Connection, now: float, lease_seconds: float) -> int:
    return int(
        conn.execute(select(func.count()).select_from(workers).where(alive(now, lease_seconds))).scalar_one()
    )
