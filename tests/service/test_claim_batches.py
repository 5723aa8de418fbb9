"""Group commit behind the claim route, on both databases: claims that arrive together share one
transaction, each job is taken once, arrival order is kept, and one order's error is its own."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import text

import flightdeck.service.api.claim_batcher as claim_batcher
from flightdeck.service.api.claim_batcher import ClaimBatcher
from flightdeck.service.api.claim_long_poll import serve_claim
from flightdeck.service.api.queue_wakeup import QueueWakeup
from flightdeck.service.claims import ClaimOrder, UnknownWorker, claim_jobs
from flightdeck.service.core.db import Database
from tests.service.test_claims import _jobs, _workers


@pytest.fixture
def db(database: Database) -> Database:
    return database


def test_concurrent_claims_share_batches_and_take_each_job_once(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _jobs(db, 30)
    workers = _workers(db, 10)
    sizes: list[int] = []

    def counted(db: Database, orders: list[ClaimOrder], lease_seconds: float, gang_wait: float) -> list[Any]:
        sizes.append(len(orders))
        return claim_jobs(db, orders, lease_seconds, gang_wait)

    monkeypatch.setattr(claim_batcher, "claim_jobs", counted)  # a spy: the real claim runs

    async def claim_all() -> list[Any]:
        batcher = ClaimBatcher(db, lease_seconds=60)
        orders = [ClaimOrder(workers[i % len(workers)]) for i in range(40)]
        return await asyncio.gather(*(batcher.claim(order) for order in orders))

    results = asyncio.run(claim_all())
    claimed = [r.job_id for r in results if r is not None]
    assert Counter(claimed) == Counter(jobs)  # every job exactly once
    assert results[30:] == [None] * 10  # the queue ran dry for the last ten orders
    assert claimed == sorted(claimed)  # arrival order is claim order: the first order got the oldest job
    assert sum(sizes) == 40 and len(sizes) < 40 and max(sizes) > 1


def test_a_claim_that_came_during_a_batch_waits_for_the_claims_the_loop_is_still_handling(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next batch starts once the event loop has caught up: the claim that arrived while a batch
    was written is joined by the claim an agent sends as soon as it has its answer (the loop is busy
    delivering answers meanwhile), instead of going alone while that one waits behind it."""
    import threading
    import time

    _jobs(db, 3)
    first, late, next_one = _workers(db, 3)
    sizes: list[int] = []
    late_queued = threading.Event()

    def counted(db: Database, orders: list[ClaimOrder], lease_seconds: float, gang_wait: float) -> list[Any]:
        sizes.append(len(orders))
        late_queued.wait(5)  # the first batch is being written when the late claim arrives
        return claim_jobs(db, orders, lease_seconds, gang_wait)

    monkeypatch.setattr(claim_batcher, "claim_jobs", counted)

    async def agents() -> list[Any]:
        batcher = ClaimBatcher(db, lease_seconds=60)

        async def claim_then_claim_again() -> Any:
            await batcher.claim(ClaimOrder(first))
            time.sleep(0.002)  # the loop's work on the answers it delivers: a turn that is not idle
            return await batcher.claim(ClaimOrder(next_one))

        agent = asyncio.ensure_future(claim_then_claim_again())
        while not sizes:  # the first batch is in its thread
            await asyncio.sleep(0.001)
        late_claim = asyncio.ensure_future(batcher.claim(ClaimOrder(late)))
        await asyncio.sleep(0)
        late_queued.set()
        return await asyncio.gather(agent, late_claim)

    answers = asyncio.run(agents())
    assert all(answer is not None for answer in answers)
    assert sizes == [1, 2]  # not [1, 1, 1]: the late claim did not go alone


def test_a_loop_that_is_never_idle_does_not_hold_claims_back(db: Database) -> None:
    """Waiting for the loop to catch up is bounded: claims are written while other requests keep every
    turn of the loop busy."""
    import time

    [job] = _jobs(db, 1)
    [worker] = _workers(db, 1)

    async def claim_while_busy() -> Any:
        stop = False

        async def busy() -> None:
            while not stop:
                time.sleep(0.001)  # every turn of the loop has work
                await asyncio.sleep(0)

        noise = asyncio.ensure_future(busy())
        try:
            return await asyncio.wait_for(ClaimBatcher(db, lease_seconds=60).claim(ClaimOrder(worker)), 10)
        finally:
            stop = True
            await noise

    assert asyncio.run(claim_while_busy()).job_id == job


def test_an_unknown_worker_fails_its_own_order_only(db: Database) -> None:
    jobs = _jobs(db, 2)
    [worker] = _workers(db, 1)
    first, unknown, second = claim_jobs(db, [ClaimOrder(worker), ClaimOrder(9999), ClaimOrder(worker)], 60)
    assert isinstance(unknown, UnknownWorker) and "9999 is not registered" in str(unknown)
    assert [first.job_id, second.job_id] == jobs  # type: ignore[union-attr]


def test_an_order_that_breaks_the_batch_fails_alone(db: Database) -> None:
    """A worker id past the database's integers rolls the batch back; the others are then written
    one by one, and only that order fails."""
    [job] = _jobs(db, 1)
    [worker] = _workers(db, 1)

    async def claim_both() -> list[Any]:
        batcher = ClaimBatcher(db, lease_seconds=60)
        orders = [ClaimOrder(worker), ClaimOrder(2**70)]
        return await asyncio.gather(*(batcher.claim(order) for order in orders), return_exceptions=True)

    good, bad = asyncio.run(claim_both())
    assert good.job_id == job
    assert isinstance(bad, Exception) and not isinstance(bad, UnknownWorker)


def test_a_claim_cancelled_before_its_batch_takes_no_job(db: Database) -> None:
    [job] = _jobs(db, 1)
    [worker] = _workers(db, 1)

    async def cancel_then_claim() -> Any:
        batcher = ClaimBatcher(db, lease_seconds=60)
        gone = asyncio.ensure_future(batcher.claim(ClaimOrder(worker)))
        await asyncio.sleep(0)  # queued, its batch not yet written
        gone.cancel()
        return await batcher.claim(ClaimOrder(worker))

    claimed = asyncio.run(cancel_then_claim())
    assert claimed is not None and claimed.job_id == job


def test_a_batch_writes_each_claim_as_its_own_attempt_of_its_own_job(db: Database) -> None:
    """The batch's picks are written together (one insert of attempts, one update of their jobs, one
    insert of their events): each answer names the attempt stored for its job, with the job's event on it."""
    jobs = _jobs(db, 12)
    workers = _workers(db, 12)
    answers = claim_jobs(db, [ClaimOrder(worker) for worker in workers], 60)
    assert [a.job_id for a in answers] == jobs  # type: ignore[union-attr]
    with db.reading() as conn:
        stored = {
            row[0]: row[1:]
            for row in conn.execute(
                text(
                    "SELECT a.id, a.job_id, a.worker_id, j.current_attempt_id, j.status, e.attempt_id "
                    "FROM attempts a JOIN jobs j ON j.id = a.job_id "
                    "JOIN events e ON e.job_id = j.id AND e.message LIKE 'attempt 1 claimed by%'"
                )
            )
        }
    for answer, worker in zip(answers, workers, strict=True):
        job, by, current, status, event_attempt = stored[answer.id]  # type: ignore[union-attr]
        assert (job, by, status) == (answer.job_id, worker, "running")  # type: ignore[union-attr]
        assert current == event_attempt == answer.id  # type: ignore[union-attr]


def test_a_stale_change_among_several_refuses_them_all(db: Database) -> None:
    """change_statuses writes several jobs' changes in one go: if one job no longer holds the status its
    change was decided on, none is written (the caller's transaction rolls back)."""
    from flightdeck.service.jobs import cancel_job
    from flightdeck.service.lifecycle import StatusChange, StatusChanged, change_statuses
    from flightdeck.statuses import JobStatus

    first, stale = _jobs(db, 2)
    cancel_job(db, stale)
    changes = [StatusChange(job, "queued", JobStatus.running, "claimed together") for job in (first, stale)]
    with pytest.raises(StatusChanged, match="1 of jobs"), db.writing() as conn:
        change_statuses(conn, changes, 0.0)
    with db.reading() as conn:
        statuses = dict(conn.execute(text("SELECT id, status FROM jobs")).all())
        events = conn.execute(text("SELECT count(*) FROM events WHERE message = 'claimed together'")).scalar()
    assert statuses == {first: "queued", stale: "cancelled"} and events == 0


def test_a_batch_of_like_workers_picks_its_jobs_in_one_query(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Orders whose workers fit the same jobs share one pick (LIMIT: the orders left in the batch), not
    one round trip each; each still gets the next job in priority order."""
    import flightdeck.service.claims as claims

    jobs = _jobs(db, 10)
    workers = _workers(db, 6)
    picks: list[dict[str, Any]] = []
    real = claims.run_compiled

    def spy(conn: Any, stmt: Any, params: Any) -> Any:
        if isinstance(params, dict) and "skipped" in params:
            picks.append(params)
        return real(conn, stmt, params)

    monkeypatch.setattr(claims, "run_compiled", spy)
    answers = claim_jobs(db, [ClaimOrder(worker) for worker in workers], 60)
    assert [a.job_id for a in answers] == jobs[:6]  # type: ignore[union-attr]
    assert [p["n"] for p in picks] == [6]


def test_two_workers_in_one_batch_fill_a_gang(db: Database) -> None:
    """A gang's job fetched for the batch is picked again as it is now: the second worker of the batch
    joins the gang the first one joined, and the gang fills in that one transaction."""
    from flightdeck.service.jobs import submit_job
    from tests.service.factories import recipe

    body = recipe(name="gang", resources={"nodes": 2, "gpus_per_node": 1, "accelerator": "cpu"})
    gang = submit_job(db, body, priority=5).id
    singles = _jobs(db, 2)
    first, second = _workers(db, 2)
    waiting, node = claim_jobs(db, [ClaimOrder(first), ClaimOrder(second)], 60)
    assert waiting is None  # joined; the gang was not full yet
    assert node is not None and node.job_id == gang  # type: ignore[union-attr]
    with db.reading() as conn:
        statuses = dict(conn.execute(text("SELECT id, status FROM jobs")).all())
    assert statuses == {gang: "running", singles[0]: "queued", singles[1]: "queued"}


def _route_state(db: Database) -> Any:
    """What serve_claim reads of the app's state: the settings' longest wait, the queue, the batcher."""
    queue = QueueWakeup()
    queue.bind(asyncio.get_running_loop())
    settings = SimpleNamespace(claim_max_wait_seconds=5.0)
    return SimpleNamespace(settings=settings, queue=queue, claims=ClaimBatcher(db, lease_seconds=60), db=db)


def test_a_claim_answered_at_once_does_not_ask_whether_its_client_left(db: Database) -> None:
    """Asking costs about 0.1 ms (a cancelled receive), a sixth of a claim's CPU under 50 agents; a
    client gone within a no-wait claim's milliseconds is the same race as one gone just after it."""
    [job] = _jobs(db, 1)
    [worker] = _workers(db, 1)
    asked: list[bool] = []

    async def gone() -> bool:
        asked.append(True)
        return False

    async def claim() -> Any:
        return await serve_claim(_route_state(db), ClaimOrder(worker), 5.0, gone)

    assert asyncio.run(claim()).job_id == job
    assert asked == []


def test_a_long_poll_woken_for_a_job_asks_first_and_a_client_gone_meanwhile_takes_nothing(
    db: Database,
) -> None:
    [worker] = _workers(db, 1)
    asked: list[bool] = []

    async def gone() -> bool:
        asked.append(True)
        return True  # the agent's connection dropped while it waited

    async def wait_then_submit() -> Any:
        state = _route_state(db)
        waiting = asyncio.ensure_future(serve_claim(state, ClaimOrder(worker), 5.0, gone))
        await asyncio.sleep(0.05)
        job = _jobs(db, 1)[0]
        state.queue.notify()
        return job, await waiting

    job, answer = asyncio.run(wait_then_submit())
    assert answer is None and asked == [True]
    with db.reading() as conn:
        assert conn.execute(text("SELECT status FROM jobs WHERE id = :id"), {"id": job}).scalar() == "queued"
