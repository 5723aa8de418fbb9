"""The claim, on both databases: each job once, priority order kept, bad orders refused before writing."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import text

from flightdeck.inventory import WorkerInventory
from flightdeck.service.claims import ClaimOrder, InvalidDevices, UnknownWorker, claim_next_job
from flightdeck.service.core.db import Database
from flightdeck.service.jobs import submit_job
from flightdeck.service.models import Event, Job
from flightdeck.service.registration import register_worker
from tests.service.factories import cpu_inventory, recipe


@pytest.fixture
def db(database: Database) -> Database:
    return database


def _workers(db: Database, count: int, prefix: str = "w") -> list[int]:
    inventory = WorkerInventory.model_validate(cpu_inventory())
    return [
        register_worker(db, f"{prefix}{i}", inventory, caller=None, lease_seconds=60)[0].id or 0
        for i in range(count)
    ]


def _jobs(db: Database, count: int, **kwargs: Any) -> list[int]:
    return [submit_job(db, recipe(name=f"j{i}"), **kwargs).id or 0 for i in range(count)]


def test_claims_take_the_highest_priority_then_the_oldest_job(db: Database) -> None:
    low = _jobs(db, 2)
    high = _jobs(db, 1, priority=5)
    [worker] = _workers(db, 1)
    order = [claim_next_job(db, ClaimOrder(worker), 60).job_id for _ in range(3)]  # type: ignore[union-attr]
    assert order == [*high, *low]
    assert claim_next_job(db, ClaimOrder(worker), 60) is None


def test_concurrent_claims_take_each_job_exactly_once(db: Database) -> None:
    jobs = _jobs(db, 40)
    workers = _workers(db, 8)
    claimed: list[int] = []
    empty: list[int] = []

    def agent(worker: int) -> None:
        while (found := claim_next_job(db, ClaimOrder(worker), 60)) is not None:
            claimed.append(found.job_id)
        empty.append(worker)

    threads = [threading.Thread(target=agent, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert Counter(claimed) == Counter(jobs) and len(empty) == len(workers)


def test_an_unknown_worker_is_refused_before_anything_is_written(db: Database) -> None:
    [job] = _jobs(db, 1)
    with pytest.raises(UnknownWorker, match="9999 is not registered"):
        claim_next_job(db, ClaimOrder(9999), 60)
    with db.read() as session:
        assert session.get(Job, job).status == "queued"  # type: ignore[union-attr]


def test_devices_the_worker_never_registered_are_refused(db: Database) -> None:
    _jobs(db, 1)
    [worker] = _workers(db, 1)
    for devices in ([0, 0], [7]):
        with pytest.raises(InvalidDevices, match="send the indices it registered"):
            claim_next_job(db, ClaimOrder(worker, devices), 60)


def test_a_worker_whose_stored_inventory_no_longer_validates_is_asked_to_register_again(
    db: Database,
) -> None:
    _jobs(db, 1)
    [stale] = _workers(db, 1)
    with db.writing() as conn:
        conn.execute(
            text("UPDATE workers SET inventory = :inv WHERE id = :id"),
            {"inv": '{"cpu_slots": "many"}', "id": stale},
        )
    with pytest.raises(UnknownWorker, match="no longer validates"):
        claim_next_job(db, ClaimOrder(stale), 60)


def test_a_job_whose_stored_recipe_no_longer_validates_fails_and_the_next_job_is_claimed(
    db: Database,
) -> None:
    stale, runnable = _jobs(db, 2)
    [worker] = _workers(db, 1)
    with db.write() as session:
        job = session.get(Job, stale)
        assert job is not None
        job.effective_recipe = {**job.effective_recipe, "training": {"bogus": 1}}
        session.add(job)
    claimed = claim_next_job(db, ClaimOrder(worker), 60)
    assert claimed is not None and claimed.job_id == runnable
    with db.read() as session:
        failed = session.get(Job, stale)
        assert failed is not None
        last_event = session.query(Event).filter(Event.job_id == stale).order_by(Event.id.desc()).first()  # type: ignore[union-attr]
    assert (failed.status, failed.failure_code) == ("failed", "P004")
    assert "no longer validates" in (failed.failure_message or "") and "POST /jobs" in (
        failed.failure_fix or ""
    )
    assert last_event is not None and last_event.message == failed.failure_message


def test_a_claimed_attempt_is_stored_as_the_api_returns_it(db: Database) -> None:
    [job] = _jobs(db, 1)
    [worker] = _workers(db, 1)
    claimed = claim_next_job(db, ClaimOrder(worker, devices=[0, 1]), 60)
    assert claimed is not None
    with db.reading() as conn:
        row = conn.execute(
            text(
                "SELECT a.id, a.number, a.worker_id, a.status, j.current_attempt_id, j.status, j.attempt_count "
                "FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.id = :job"
            ),
            {"job": job},
        ).one()
    attempt_id, number, worker_id, status, current, job_status, count = row
    assert (attempt_id, number, worker_id, status) == (claimed.id, 1, worker, "running")
    assert current == attempt_id and job_status == "running" and count == 1
    assert claimed.plan["devices"] == [0, 1]
    with db.read() as session:
        events = session.query(Event).filter(Event.job_id == job).order_by(Event.id).all()  # type: ignore[arg-type]
    # The claim's status change went through set_status: it is on the job's timeline, with the attempt.
    assert events[-1].attempt_id == attempt_id and "attempt 1 claimed by w0" in events[-1].message


@pytest.mark.postgres
def test_two_service_processes_claim_side_by_side_without_waiting_on_each_other(
    postgres_cluster: Any,
) -> None:
    """PostgreSQL only: two Database objects (two processes' write locks) claim the same queue. With
    FOR UPDATE SKIP LOCKED, the second claimer takes the next job while the first holds its row."""
    from tests.conftest import TEMPLATE_DB

    url = postgres_cluster.create_database("two_services", template=TEMPLATE_DB)
    # Without SKIP LOCKED the second claim would wait for the first transaction: fail in 3 s, not hang.
    first, second = Database(url), Database(url + "&options=-c%20lock_timeout%3D3000")
    try:
        jobs = _jobs(first, 2)
        [a, b] = _workers(first, 2)
        with first.write() as session:
            # The first service's claim is mid-transaction, holding the oldest job's row.
            held = session.exec(text("SELECT id FROM jobs ORDER BY id LIMIT 1 FOR UPDATE")).scalar()  # type: ignore[call-overload]
            got = claim_next_job(second, ClaimOrder(b), 60)
            assert held == jobs[0] and got is not None and got.job_id == jobs[1]
        assert claim_next_job(first, ClaimOrder(a), 60).job_id == jobs[0]  # type: ignore[union-attr]
    finally:
        first.close()
        second.close()
        postgres_cluster.drop_database("two_services")


def test_the_claim_is_one_index_probe_on_sqlite(db: Database) -> None:
    """The pick reads ix_jobs_claim in its order: no sort of the queued jobs (migration 0007). Only the
    few rows picked (at most one per claim of the batch) are sorted, outside the subquery."""
    from sqlalchemy.dialects import sqlite

    from flightdeck.service.claims import pick

    if not db.is_sqlite:
        pytest.skip("SQLite's query plan; PostgreSQL's index was never rebuilt by a batch migration")
    inventory = WorkerInventory.model_validate(cpu_inventory())
    query = pick(inventory, 2)
    sql = str(query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
    with db.reading() as conn:
        rows = [(row[0], row[1], str(row[-1])) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
    plan = " | ".join(detail for _, _, detail in rows)
    subqueries = {node for node, _, detail in rows if detail.startswith("LIST SUBQUERY")}
    inner = [detail for _, parent, detail in rows if parent in subqueries]
    assert any("USING INDEX ix_jobs_claim" in detail for detail in inner), plan
    assert not any("TEMP B-TREE" in detail for detail in inner), plan  # the queued jobs are not sorted
    sorts = [parent for _, parent, detail in rows if "TEMP B-TREE" in detail]
    assert sorts in ([], [0]), plan  # at most the outer sort of the picked rows


def test_a_status_change_decided_on_a_stale_status_is_refused_and_writes_nothing(db: Database) -> None:
    """change_status writes only if the row still holds the status the change was decided on."""
    from flightdeck.service.jobs import cancel_job
    from flightdeck.service.lifecycle import StatusChanged, change_status
    from flightdeck.statuses import JobStatus

    [job] = _jobs(db, 1)
    cancel_job(db, job)  # now cancelled; a writer that still believes "queued" must not win
    with pytest.raises(StatusChanged), db.writing() as conn:
        change_status(conn, job, "queued", JobStatus.running, 0.0, "stale claim")
    with db.read() as session:
        stored = session.get(Job, job)
        messages = [e.message for e in session.query(Event).filter(Event.job_id == job)]  # type: ignore[arg-type]
    assert stored is not None and stored.status == "cancelled" and "stale claim" not in messages


@pytest.mark.postgres
def test_after_a_burst_of_submissions_the_service_analyzes_jobs_and_the_claim_reads_its_index(
    postgres_cluster: Any, tmp_path: Any
) -> None:
    """PostgreSQL only: with no statistics on 3,000 fresh queued jobs the planner sorts them all per claim;
    the service's reaper pass analyzes `jobs` after a burst, and the pick then reads ix_jobs_claim in order."""
    from fastapi.testclient import TestClient
    from sqlalchemy.dialects import postgresql

    from flightdeck.service.api.app import create_app
    from flightdeck.service.claims import pick
    from tests.conftest import TEMPLATE_DB
    from tests.service.conftest import make_settings

    url = postgres_cluster.create_database("burst", template=TEMPLATE_DB)
    db = Database(url)
    try:
        [first] = _jobs(db, 1)
        with db.writing() as conn:  # 2,999 copies of it: a burst, faster than 3,000 submissions
            columns = ", ".join(
                row[0]
                for row in conn.exec_driver_sql(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = 'jobs' AND column_name <> 'id'"
                )
            )
            conn.execute(
                text(
                    f"INSERT INTO jobs ({columns}) SELECT {columns} FROM jobs, generate_series(1, 2999) WHERE id = :id"
                ),
                {"id": first},
            )
            conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")  # the counts reach pg_stat at commit

        sql = str(
            pick(WorkerInventory.model_validate(cpu_inventory()), 2).compile(
                dialect=postgresql.dialect(),
                compile_kwargs={"literal_binds": True, "render_postcompile": True},
            )
        )

        def plan() -> str:
            with db.reading() as conn:
                return "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + sql))

        def sorts_the_queue(plan: str) -> bool:
            # Below LockRows is the pick's read of the queue; a Sort above it orders only the rows picked.
            below = plan.split("LockRows", 1)
            assert len(below) == 2, plan
            return "Sort" in below[1]

        assert sorts_the_queue(plan())  # the problem: every queued job read and sorted for one claim
        settings = make_settings(tmp_path / "data", database_url_override=url, reaper_interval_seconds=0.1)
        with TestClient(create_app(settings)):
            deadline = time.monotonic() + 10
            while sorts_the_queue(plan()) and time.monotonic() < deadline:
                time.sleep(0.1)
        after = plan()
        assert not sorts_the_queue(after) and "Index Scan using ix_jobs_claim" in after, after
    finally:
        db.close()
        postgres_cluster.drop_database("burst")
