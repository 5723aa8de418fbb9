"""The plain claim path (FLIGHTDECK_CLAIM_PATH=plain): one transaction per claim, no batcher.

Each claim runs `claims.claim_next_job` alone in the thread pool: one pick of one row (`LIMIT 1
... FOR UPDATE SKIP LOCKED` on PostgreSQL, so concurrent claimers skip each other's row; on SQLite the
service's write lock serialises the transactions), the plan, the attempt's insert and the guarded
queued -> running change, committed at once. It is the same code the batcher runs for a batch of one,
with every check (revocation, devices, gangs, P004) and nothing shared between claims.

bench/README.md ("Claims under realistic load") compares it with the batched path (claim_batcher.py)
under 1,000 agents claiming every 30-120 s, ten times that, and 1,000 agents reconnecting at once.
"""

from __future__ import annotations

from fastapi.concurrency import run_in_threadpool

from flightdeck.contracts import ClaimedAttempt
from flightdeck.service.claims import ClaimOrder, claim_next_job
from flightdeck.service.core.db import Database


class PlainClaims:
    """Serves each claim order in its own transaction, as it arrives."""

    def __init__(self, db: Database, lease_seconds: float, gang_wait: float = 30.0):
        self._db = db
        self._lease_seconds = lease_seconds
        self._gang_wait = gang_wait

    async def claim(self, order: ClaimOrder) -> ClaimedAttempt | None:
        """The attempt this order got (None: nothing fits now); an error of
        the order's own (an unknown worker, devices it never registered) is raised."""
        return await run_in_threadpool(claim_next_job, self._db, order, self._lease_seconds, self._gang_wait)
