"""Claims written in batches (group commit): each job once, arrival order kept, one order's error its own."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import service.api.claim_batcher as claim_batcher
from service.api.claim_batcher import ClaimBatcher
from service.claims import ClaimOrder, UnknownWorker, claim_jobs
from service.core.db import Database, migrate
from service.inventory import WorkerInventory
from service.jobs import submit_job
from service.leases import register_worker
from service.worker_identity import WorkerIdentities
from tests.service.factories import cpu_inventory, recipe


@pytest.fixture
def db(tmp_path: Path) -> Database:
    url = f"sqlite:///{tmp_path / 'flightdeck.db'}"
    migrate(url)
    return Database(url)


def _workers(db: Database, count: int) -> list[int]:
    inventory = WorkerInventory.model_validate(cpu_inventory())
    return [
        register_worker(
            db, f"w{i}", inventory, caller=None, lease_seconds=60, identities=WorkerIdentities(db)
        )[0].id
        or 0
        for i in range(count)
    ]


def _jobs(db: Database, count: int) -> list[int]:
    return [submit_job(db, recipe(name=f"j{i}")).id or 0 for i in range(count)]


def test_concurrent_claims_share_batches_and_take_each_job_once(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _jobs(db, 30)
    workers = _workers(db, 10)
    sizes: list[int] = []

    def counted(db: Database, orders: list[ClaimOrder], lease_seconds: float) -> list[Any]:
        sizes.append(len(orders))
        return claim_jobs(db, orders, lease_seconds)

    monkeypatch.setattr(claim_batcher, "claim_jobs", counted)  # a spy: the real claim runs

    async def claim_all() -> list[Any]:
        batcher = ClaimBatcher(db, lease_seconds=60)
        orders = [ClaimOrder(workers[i % len(workers)]) for i in range(40)]
        return await asyncio.gather(*(batcher.claim(order) for order in orders))

    results = asyncio.run(claim_all())
    claimed = [r["job_id"] for r in results if r is not None]
    assert Counter(claimed) == Counter(jobs)  # every job exactly once
    assert results[30:] == [None] * 10  # the queue ran dry for the last ten orders
    # Arrival order is claim order: the first order got the oldest job.
    assert claimed == sorted(claimed)
    assert sum(sizes) == 40 and len(sizes) < 40 and max(sizes) > 1


def test_an_unknown_worker_fails_its_own_order_only(db: Database) -> None:
    jobs = _jobs(db, 2)
    [worker] = _workers(db, 1)
    orders = [ClaimOrder(worker), ClaimOrder(9999), ClaimOrder(worker)]
    first, unknown, second = claim_jobs(db, orders, 60)
    assert isinstance(unknown, UnknownWorker) and "9999 is not registered" in str(unknown)
    assert [first["job_id"], second["job_id"]] == jobs  # type: ignore[index]


def test_a_worker_whose_stored_inventory_no_longer_validates_is_asked_to_register_again(
    db: Database,
) -> None:
    _jobs(db, 1)
    [good, stale] = _workers(db, 2)
    with db.raw_write() as conn:
        conn.execute('UPDATE workers SET inventory = \'{"cpu_slots": "many"}\' WHERE id = ?', (stale,))
    claimed, refused = claim_jobs(db, [ClaimOrder(good), ClaimOrder(stale)], 60)
    assert claimed is not None and not isinstance(claimed, Exception)
    assert isinstance(refused, UnknownWorker) and "no longer validates" in str(refused)


def test_a_job_whose_stored_recipe_no_longer_validates_fails_and_the_next_job_is_claimed(
    db: Database,
) -> None:
    stale, runnable = _jobs(db, 2)
    [worker] = _workers(db, 1)
    with db.raw_write() as conn:
        conn.execute(
            "UPDATE jobs SET effective_recipe = json_set(effective_recipe, '$.training.bogus', 1) "
            "WHERE id = ?",
            (stale,),
        )
    [claimed] = claim_jobs(db, [ClaimOrder(worker)], 60)
    assert claimed is not None and not isinstance(claimed, Exception)
    assert claimed["job_id"] == runnable
    with sqlite3.connect(db.url.removeprefix("sqlite:///")) as conn:
        status, code, message, fix = conn.execute(
            "SELECT status, failure_code, failure_message, failure_fix FROM jobs WHERE id = ?", (stale,)
        ).fetchone()
        event = conn.execute(
            "SELECT message FROM events WHERE job_id = ? ORDER BY id DESC", (stale,)
        ).fetchone()
    assert (status, code) == ("failed", "P004")
    assert "no longer validates" in message and "bogus" in message and "POST /jobs" in fix
    assert event[0] == message


def test_a_claimed_attempt_is_stored_as_the_api_returns_it(db: Database) -> None:
    [job] = _jobs(db, 1)
    [worker] = _workers(db, 1)
    [claimed] = claim_jobs(db, [ClaimOrder(worker, devices=[0, 1])], 60)
    assert isinstance(claimed, dict)
    with sqlite3.connect(db.url.removeprefix("sqlite:///")) as conn:
        row = conn.execute(
            "SELECT a.id, a.number, a.worker_id, a.status, a.plan, j.current_attempt_id, j.status "
            "FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.id = ?",
            (job,),
        ).fetchone()
    attempt_id, number, worker_id, status, plan, current, job_status = row
    assert (attempt_id, number, worker_id, status) == (claimed["id"], 1, worker, "running")
    assert current == attempt_id and job_status == "running"
    assert json.loads(plan) == claimed["plan"] and claimed["plan"]["devices"] == [0, 1]


def test_an_order_that_breaks_the_batch_fails_alone(db: Database) -> None:
    """Regression (review): a worker id past SQLite's integers rolled back the batch for everyone."""
    [job] = _jobs(db, 1)
    [worker] = _workers(db, 1)

    async def claim_both() -> list[Any]:
        batcher = ClaimBatcher(db, lease_seconds=60)
        orders = [ClaimOrder(worker), ClaimOrder(2**70)]
        return await asyncio.gather(*(batcher.claim(order) for order in orders), return_exceptions=True)

    good, bad = asyncio.run(claim_both())
    assert good["job_id"] == job
    assert isinstance(bad, OverflowError)


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
    assert claimed is not None and claimed["job_id"] == job
