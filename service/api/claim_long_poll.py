"""A claim served as a long-poll: the claim is tried, and tried again each time the queue changes, until
it gets an attempt or its wait runs out; an attempt claimed for an agent that has gone meanwhile is
handed back at once (service/attempt_endings.py `hand_back_claim`), so a dropped connection costs the
job no attempt. The claim route (service/api/routes/workers.py) authenticates and parses; this is what
it waits on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from fastapi.concurrency import run_in_threadpool

from flightdeck.contracts import ClaimedAttempt
from flightdeck.service.api.deps import AppState
from flightdeck.service.attempt_endings import hand_back_claim
from flightdeck.service.claims import ClaimOrder, RevokedWorker


async def serve_claim(
    state: AppState, order: ClaimOrder, wait: float, gone: Callable[[], Awaitable[bool]]
) -> ClaimedAttempt | None:
    """The attempt `order` gets within `wait` seconds (long-poll), or None; LookupError: unknown worker.

    `gone` says whether the client has disconnected: an attempt claimed for a client that is no longer
    there is handed back at once (its answer could never arrive), so a dropped connection costs the job
    no attempt. Only a claim that has waited asks: asking is a cancelled receive, about 0.1 ms, which
    was a sixth of a claim's CPU with 50 agents claiming back to back (bench/README.md), and a client
    gone within a no-wait claim's milliseconds is the same race as one gone just after its answer
    (the lease then runs out and the job is queued again).
    """
    deadline = time.monotonic() + min(wait, state.settings.claim_max_wait_seconds)
    waited = False
    while True:
        wake = state.queue.current()  # taken before looking, so a job queued meanwhile is not missed
        if waited and await gone():
            return None
        try:
            claimed = await state.claims.claim(order)  # group commit with the claims arriving alongside
        except RevokedWorker:
            return None  # revoked while it waited: nothing is handed over, the next call is refused
        if claimed is not None:
            if waited and await gone():
                await run_in_threadpool(hand_back_claim, state.db, claimed.id, order.worker_id)
                state.queue.notify()  # a released job is claimable again at once
                return None
            if claimed.node is not None:
                state.queue.notify()  # the gang's other members are long-polling for their nodes
            return claimed
        remaining = deadline - time.monotonic()
        if remaining <= 0 or state.queue.stopping:
            return None
        try:
            await asyncio.wait_for(wake.wait(), timeout=remaining)
        except TimeoutError:
            return None
        waited = True
