"""Worker identities: the enrolment token registers a worker, and the answer holds that worker's own
token; every later worker call authenticates as that one worker.

Only the SHA-256 digest of a worker's token is stored (workers.token_hash, unique and indexed), and
every worker call looks its digest up there: one indexed read, and no copy in any process. Two service
processes on one PostgreSQL once disagreed for as long as a per-process cache lived (a revoked token
still accepted by the process that had not revoked it, a new worker refused by the other).
"""

from __future__ import annotations

import secrets

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import bindparam, select

from flightdeck.service.core.auth import digest
from flightdeck.service.core.db import Database
from flightdeck.service.core.sql import run_compiled
from flightdeck.service.core.tables import workers

_BY_DIGEST = select(workers.c.id).where(workers.c.token_hash == bindparam("digest"))


class WorkerIdentities:
    def __init__(self, db: Database):
        self.db = db

    def worker_of_digest(self, token_digest: str) -> int | None:
        """The worker whose token has this digest now, or None (unknown, replaced or revoked)."""
        with self.db.reading() as conn:
            rows = run_compiled(conn, _BY_DIGEST, {"digest": token_digest}).rows
        return int(rows[0][0]) if rows else None

    async def worker_of(self, token: str) -> tuple[int, str] | None:
        """(the worker this token identifies, the token's digest), or None."""
        token_digest = digest(token)
        if self.db.is_sqlite:
            # In-process and indexed: microseconds, less than the hop to a thread would cost.
            worker_id = self.worker_of_digest(token_digest)
        else:
            # A round trip (or, in an outage, a failing connect) must not hold up the event loop.
            worker_id = await run_in_threadpool(self.worker_of_digest, token_digest)
        return None if worker_id is None else (worker_id, token_digest)


def new_worker_token() -> tuple[str, str]:
    """(token, its digest): the token is shown once, in the registration answer."""
    token = "fdw_" + secrets.token_urlsafe(32)
    return token, digest(token)
