"""Group commit for claims: claims that arrive while a batch is being written go in the next one.

There is no timer and no batch size to tune. An idle service writes a lone claim at once (a batch
of one); under load, every claim that arrived during the previous batch's transaction is served by
the next, so the commit, the thread hop and the write lock are paid once per batch.

A batch starts once the event loop has caught up (`_loop_caught_up`): answers to send, requests read
and routed. Started at once instead, it took the one claim that had arrived during the last batch and
ran while the event loop was still sending that batch's answers and reading the agents' next claims,
which then waited for it: with 50 agents claiming back to back the batches settled into 49 + 1, and
every claim waited for two transactions (bench/README.md).

It sits behind the claim route's long-poll (`claim_long_poll.serve_claim`), after the route's own authentication, parameter
and body checks: a claim reaches it only as a checked ClaimOrder. Kept because the plain route,
one transaction per claim, measured 477 claims/s and a p99 of 180 ms for 50 agents claiming back
to back (goal: 50 ms); bench/README.md has the figures with and without it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi.concurrency import run_in_threadpool

from flightdeck.contracts import ClaimedAttempt
from flightdeck.service.claims import ClaimOrder, ClaimResult, claim_jobs
from flightdeck.service.core.db import Database

log = logging.getLogger("flightdeck.claims")

# A turn of the event loop shorter than this found nothing else to do (one request's handling takes
# longer, an empty turn about a tenth of it).
IDLE_TURN_SECONDS = 0.0001
# The longest a batch waits for the loop to catch up: a loop that is never idle (a flood of metric
# reports) must not hold claims back.
MAX_CATCH_UP_SECONDS = 0.01


async def _loop_caught_up() -> None:
    """Return once a turn of the event loop finds nothing else to do, or after MAX_CATCH_UP_SECONDS."""
    start = time.perf_counter()
    while True:
        before = time.perf_counter()
        await asyncio.sleep(0)  # one turn: every ready callback runs, and what the sockets have is read
        now = time.perf_counter()
        if now - before < IDLE_TURN_SECONDS or now - start >= MAX_CATCH_UP_SECONDS:
            return


class ClaimBatcher:
    """Queues claim orders from request handlers (one event loop) and writes them in batches."""

    def __init__(self, db: Database, lease_seconds: float, gang_wait: float = 30.0):
        self._db = db
        self._lease_seconds = lease_seconds
        self._gang_wait = gang_wait
        self._waiting: list[tuple[ClaimOrder, asyncio.Future[ClaimResult]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def claim(self, order: ClaimOrder) -> ClaimedAttempt | None:
        """The attempt this order got, as ClaimedAttempt's fields (None: nothing fits now).

        An error of the order's own (an unknown worker) is raised here.
        """
        future: asyncio.Future[ClaimResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((order, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_batches())
        result = await future
        if isinstance(result, Exception):
            raise result
        return result

    async def _write_batches(self) -> None:
        batch: list[tuple[ClaimOrder, asyncio.Future[ClaimResult]]] = []
        try:
            while self._waiting:
                await _loop_caught_up()  # the claims whose requests the loop is still handling join in
                # A handler cancelled before its batch is written (client gone) takes no job.
                batch = [(order, future) for order, future in self._waiting if not future.done()]
                self._waiting = []
                if batch:
                    results = await self._write([order for order, _ in batch])
                    for (_, future), result in zip(batch, results, strict=True):
                        # A claim whose client left after its batch was written keeps its job until
                        # the lease runs out, then the job is requeued (lease_lost), as for a dead agent.
                        if not future.done():
                            future.set_result(result)
        except BaseException:
            # Shutdown, or a bug here: no handler may wait forever on an order nobody will write.
            for _, future in [*batch, *self._waiting]:
                future.cancel()
            raise
        finally:
            self._writer = None

    async def _write(self, orders: list[ClaimOrder]) -> list[ClaimResult]:
        """One transaction for the batch; if it fails, each order alone, so one bad order fails alone."""
        try:
            return await run_in_threadpool(claim_jobs, self._db, orders, self._lease_seconds, self._gang_wait)
        except Exception as exc:  # rolled back: no order of the batch got a job
            if len(orders) == 1:
                log.exception("a claim failed")
                return [exc]
            log.warning("a batch of %d claims failed (%s); writing them one by one", len(orders), exc)
        return [result for order in orders for result in await self._write([order])]
