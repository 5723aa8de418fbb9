"""The claim: the oldest highest-priority queued job that fits a worker becomes its next attempt.

Each claim, read like the sentence above (claims arriving together share one transaction:
service/api/claim_batcher.py):
1. pick the job: `SELECT ... WHERE status = 'queued' AND <fits> ORDER BY priority DESC, id LIMIT :n
   FOR UPDATE SKIP LOCKED` (`pick`). On PostgreSQL the rows stay locked until the commit and a
   concurrent claimer skips them and takes the next jobs at once (without SKIP LOCKED it would wait
   for this transaction, then find its rows taken). SQLite has no row locks (SQLAlchemy leaves the
   clause out); there the service's write lock serialises claims. The first claim of a batch fetches
   the jobs of every claim left in it (`_Picks`), so a batch of like workers costs one pick.
2. plan the launch on this worker's devices (a job that cannot be launched fails with P004, and the
   claim takes the next one);
3. write the attempt, its nodes (node 0 for a single-node job: every attempt is a gang, of one here;
   the nodes hold the leases) and move the job to running (`running`, through `change_statuses`, the
   one status change). The batch's picks are written together once every claim has its job: one insert
   of their attempts, one of their nodes, one update of their jobs and one insert of their events (on PostgreSQL each is
   one statement over arrays: service/core/sql.py). Until then a picked job still reads as queued, so
   each claim leaves out the batch's earlier picks (`taken`).

On PostgreSQL a batch of 50 claims was 200 statements and is now five, and BEGIN and COMMIT
(bench/README.md).
SQLAlchemy Core, not the ORM: loading and flushing the job as an object cost 1.5 ms per claim, four
times the statements themselves (bench/README.md).
"""

from __future__ import annotations

import collections
import functools
import time
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError
from sqlalchemy import ColumnElement, Connection, Integer, String, and_, bindparam, not_, select

from flightdeck.contracts import ClaimedAttempt, claimed_attempt
from flightdeck.inventory import WorkerInventory
from flightdeck.launch.plan import PlanError, build_launch_plan
from flightdeck.recipe import Recipe
from flightdeck.service.core.db import Database
from flightdeck.service.core.sql import (
    execute_many_rows,
    json_value,
    many_rows_insert,
    not_among,
    run_compiled,
)
from flightdeck.service.core.tables import attempt_nodes, attempts, jobs, workers
from flightdeck.service.gangs.gather import GangState, gang_state, in_gang, join_gang
from flightdeck.service.lifecycle import NEW_ATTEMPT, NEW_NODE, change_statuses, fail_unlaunchable, running
from flightdeck.service.worker_liveness import count_alive
from flightdeck.statuses import JobStatus


@dataclass(frozen=True)
class ClaimOrder:
    """One agent asking for a job: its worker id, and the devices it has free (None: all of them)."""

    worker_id: int
    devices: list[int] | None = None
    # The digest of the token the claim authenticated with: the claim's own transaction re-checks that
    # the worker still holds it, so a revocation during a long-poll hands that claim nothing. None
    # (in-process callers): the worker must merely not be revoked.
    token_hash: str | None = None
    # A worker of several nodes: how many have `devices` free (None: all of them).
    nodes: int | None = None


class InvalidDevices(ValueError):
    """The claim names devices the worker never registered, or one twice: the API answers 422."""


class UnknownWorker(LookupError):
    """The API answers 404 with 'register again'."""

    def __init__(self, worker_id: int, why: str = "is not registered"):
        super().__init__(f"worker {worker_id} {why}")


class RevokedWorker(UnknownWorker):
    """The worker's token was revoked (or replaced) after the claim authenticated: the claim gets
    nothing (204), and the worker's next call is refused as unknown (401)."""


ClaimResult = ClaimedAttempt | None | Exception


def claim_next_job(
    db: Database, order: ClaimOrder, lease_seconds: float, gang_wait: float = 30.0
) -> ClaimedAttempt | None:
    """The attempt `order` gets now; None when no queued job fits.

    UnknownWorker and InvalidDevices are raised before anything is written.
    """
    [result] = claim_jobs(db, [order], lease_seconds, gang_wait)
    if isinstance(result, Exception):
        raise result
    return result


def claim_jobs(
    db: Database, orders: list[ClaimOrder], lease_seconds: float, gang_wait: float = 30.0
) -> list[ClaimResult]:
    """Serve `orders` in order in one transaction (group commit: service/api/claim_batcher.py).

    `gang_wait`: how long a worker waits in the gang of a multi-node job before it is released
    (service/gangs/).

    Each gets an attempt, None (nothing fits) or its own error (an unknown worker, devices it never
    registered), which is found before that order writes anything and does not undo the others;
    any other error rolls the whole transaction back and is raised.
    """
    now = time.time()
    database = db.database_id  # read once per service: plans put run directories under it
    results: list[ClaimResult | _Picked] = []
    with db.writing() as conn:
        # The batch's workers in one query (one round trip per batch, not per claim); a worker with a
        # second order in the batch is read again, since its first may have joined a gang.
        stored = _stored_workers(conn, [order.worker_id for order in orders])
        served: set[int] = set()
        taken: list[int] = []
        picks = _Picks(conn, len(orders))
        for order in orders:
            picks.orders_left -= 1
            if order.worker_id in served:
                stored.update(_stored_workers(conn, [order.worker_id]))
            served.add(order.worker_id)
            result: ClaimResult | _Picked
            try:
                worker = _worker(order, stored.get(order.worker_id))
                result = _claim_one(
                    conn, order, worker, picks, taken, lease_seconds, gang_wait, now, database
                )
            except (UnknownWorker, InvalidDevices) as exc:
                result = exc
            if isinstance(result, _Picked):
                taken.append(result.job_id)
            results.append(result)
        written = _write_picked(conn, [r for r in results if isinstance(r, _Picked)], lease_seconds, now)
    return [written[r.job_id] if isinstance(r, _Picked) else r for r in results]


@dataclass(frozen=True)
class _Picked:
    """A job picked and planned for one order, its attempt not written yet (`_write_picked`)."""

    job_id: int
    number: int
    started_at: float | None
    worker_id: int
    worker_name: str
    address: str
    devices: list[int]
    nodes: int  # all held by this worker
    recipe: Any
    plan: dict[str, Any]


def _claim_one(
    conn: Connection,
    order: ClaimOrder,
    worker: tuple[str, WorkerInventory, bool],
    picks: _Picks,
    taken: list[int],
    lease_seconds: float,
    gang_wait: float,
    now: float,
    database: str,
) -> _Picked | ClaimedAttempt | None:
    """The job this order gets (`taken`: jobs the batch picked already): a _Picked to write, a gang
    node's attempt (written by the gang), or None."""
    name, inventory, in_gang = worker
    gang = gang_state(conn, order.worker_id, now, lease_seconds, gang_wait) if in_gang else GangState()
    if gang.delivered is not None or gang.waiting:
        return gang.delivered  # a node of a filled gang, or None while the worker's gang gathers
    registered = _all_devices(inventory)
    if order.devices is not None and (
        len(set(order.devices)) != len(order.devices) or not set(order.devices) <= set(registered)
    ):
        # Only devices the worker registered, each once: the plan must never name another GPU.
        raise InvalidDevices(
            f"devices {sorted(order.devices)[:16]} are not distinct devices of this worker's inventory "
            f"{registered[:16]}; send the indices it registered, each once"
        )
    free = order.devices if order.devices is not None else registered
    skipped = [*taken, *gang.skipped]
    next_job = pick(inventory, len(free))
    while (job := picks.next(next_job, skipped)) is not None:
        job_id, count, started_at, stored_recipe, nodes = job
        # A worker that places every node of the job takes them all at once, as one attempt: one node for
        # a single-node job, N for a worker whose scheduler places N (a Slurm partition). A worker that
        # places fewer joins the job's gang of hosts (service/gangs/).
        joins_gang = inventory.nodes < nodes
        if joins_gang and (inventory.nodes > 1 or count_alive(conn, now, lease_seconds) < nodes):
            # More nodes than the partition has, or nothing could fill this gang now: take the job
            # behind it instead of waiting in vain.
            skipped.append(job_id)
            continue
        if not joins_gang and order.nodes is not None and nodes > order.nodes:
            skipped.append(job_id)  # more nodes than the partition has free now: it waits for them
            continue
        effective = json_value(stored_recipe)
        number = count + 1
        try:
            recipe = Recipe.model_validate(effective)
            given = free[: recipe.resources.gpus_per_node]
            if joins_gang:
                return join_gang(
                    conn,
                    job_id=job_id,
                    number=number,
                    started_at=started_at,
                    recipe=recipe,
                    effective=effective,
                    worker_id=order.worker_id,
                    devices=given,
                    now=now,
                    lease_seconds=lease_seconds,
                    gang_wait=gang_wait,
                    database=database,
                )
            # Several nodes of one worker: its scheduler says which node is which (scheduled).
            plan = build_launch_plan(
                recipe,
                inventory,
                job_id=job_id,
                attempt_number=number,
                devices=given,
                database=database,
                scheduled=nodes > 1,
            )
        except PlanError as exc:
            # Failing the job keeps one unlaunchable job from blocking every later claim; take the next.
            _fail_unplannable(conn, job_id, str(exc), _DEVICES_FIX, now)
            continue
        except ValidationError as exc:  # stored under an older schema that no longer accepts it
            _fail_unplannable(conn, job_id, f"its recipe no longer validates: {exc}", _RESUBMIT_FIX, now)
            continue
        plan_json = plan.model_dump(mode="json")
        return _Picked(
            job_id,
            number,
            started_at,
            order.worker_id,
            name,
            inventory.address,
            given,
            nodes,
            effective,
            plan_json,
        )
    return None


def _write_picked(
    conn: Connection, picked: list[_Picked], lease_seconds: float, now: float
) -> dict[int, ClaimedAttempt]:
    """Write the batch's picks: their attempts, each attempt's nodes (all held by the claiming worker,
    each with its lease), then each job queued -> running. By job id, each claimed attempt."""
    if not picked:
        return {}
    attempts = [
        {
            "job_id": p.job_id,
            "number": p.number,
            "worker_id": p.worker_id,
            "status": NEW_ATTEMPT.value,
            "started_at": now,
            "nnodes": p.nodes,
            "plan": orjson.dumps(p.plan).decode(),
            "findings": "[]",
        }
        for p in picked
    ]
    rows = [tuple(attempt[name] for name in _ATTEMPT_COLUMNS) for attempt in attempts]
    written = execute_many_rows(conn, _new_attempts(conn.dialect.name), _ATTEMPT_COLUMNS, rows)
    claimed: dict[int, int] = dict(written.rows)  # job id -> its new attempt's id
    lease = now + lease_seconds
    nodes = [
        (p.job_id, p.worker_id, claimed[p.job_id], rank, NEW_NODE.value, devices, now, lease, p.address)
        for p in picked
        for devices in [orjson.dumps(p.devices).decode()]
        for rank in range(p.nodes)
    ]
    execute_many_rows(conn, _new_nodes(conn.dialect.name), _NODE_COLUMNS, nodes)
    change_statuses(
        conn,
        [
            running(
                p.job_id,
                attempt_id=claimed[p.job_id],
                number=p.number,
                started_at=p.started_at or now,
                worker_name=p.worker_name,
                message=f"attempt {p.number} claimed by {p.worker_name} (devices {p.devices})",
            )
            for p in picked
        ],
        now,
    )
    return {
        p.job_id: claimed_attempt(
            claimed[p.job_id],
            p.job_id,
            p.number,
            p.recipe,
            p.plan,
            lease_seconds,
            claimed_at=now,
            job_started_at=p.started_at or now,
        )
        for p in picked
    }


# Statements are built once (per dialect) and run with parameters on the driver (service/core/sql.py):
# building one per claim (its coercions and cache keys) cost more than running it.
_ATTEMPT_COLUMNS = (
    "job_id",
    "number",
    "worker_id",
    "status",
    "started_at",
    "nnodes",
    "plan",
    "findings",
)


@functools.cache
def _new_attempts(dialect: str) -> Any:
    return many_rows_insert(dialect, attempts, _ATTEMPT_COLUMNS).returning(attempts.c.job_id, attempts.c.id)


# In the table's order (SQLite's parameters are positional).
_NODE_COLUMNS = (
    "job_id",
    "worker_id",
    "attempt_id",
    "node_rank",
    "status",
    "devices",
    "joined_at",
    "lease_expires_at",
    "address",
)


@functools.cache
def _new_nodes(dialect: str) -> Any:
    return many_rows_insert(dialect, attempt_nodes, _NODE_COLUMNS)


def pick(inventory: WorkerInventory, devices: int) -> Any:
    """The oldest highest-priority queued job that fits, its row locked; rows others hold are skipped,
    and so are the ids in the JSON array `skipped` (this batch's earlier picks, gangs this worker
    cannot join now).

    ix_jobs_claim is (status, priority DESC, id): the first row is one index probe.
    """
    gpus = inventory.gpus
    return _pick(
        bool(gpus),
        min((g.capability for g in gpus), default=0.0),
        min((g.memory_mb for g in gpus), default=0),
        inventory.runs_scripts,
        devices,
    )


@functools.lru_cache(maxsize=1024)
def _pick(gpus: bool, capability: float, memory_mb: int, runs_scripts: bool, devices: int) -> Any:
    # The id is picked alone, then its row read: when PostgreSQL has no statistics yet (a burst of
    # submissions) it sorts the queued jobs, and sorting ids instead of whole rows measured 2.1 against
    # 3.3 ms a claim with 3,000 queued.
    first = (
        select(jobs.c.id)
        .where(
            jobs.c.status == JobStatus.queued.value,
            _fits(gpus, capability, memory_mb, runs_scripts, devices),
            not_among(jobs.c.id, bindparam("skipped", "[]", type_=String)),
        )
        .order_by(jobs.c.priority.desc(), jobs.c.id)
        .limit(bindparam("n", 1, type_=Integer))
        .with_for_update(skip_locked=True)
    )
    return (
        select(jobs.c.id, jobs.c.attempt_count, jobs.c.started_at, jobs.c.effective_recipe, jobs.c.req_nodes)
        .where(jobs.c.id.in_(first))
        .order_by(jobs.c.priority.desc(), jobs.c.id)
    )


class _Picks:
    """The batch's picks. The first order that needs a pick statement fetches the jobs for every order
    left in the batch at once (`LIMIT :n`): one round trip instead of one per claim, which on PostgreSQL
    was most of a claim's time. Each order then takes the next of those jobs that is not in its
    `skipped` (the batch's earlier picks, its gang's skips); when they run out, it picks again."""

    def __init__(self, conn: Connection, orders: int):
        self._conn = conn
        self._fetched: dict[int, collections.deque[Any]] = {}
        self.orders_left = orders  # after the one being served

    def next(self, statement: Any, skipped: list[int]) -> Any:
        fetched = self._fetched.get(id(statement))
        job = self._take(fetched, skipped)
        if job is None:
            limit = 1 + self.orders_left if fetched is None else 1
            params = {"skipped": orjson.dumps(skipped).decode(), "n": limit}
            fetched = self._fetched[id(statement)] = collections.deque(
                run_compiled(self._conn, statement, params).rows
            )
            job = self._take(fetched, skipped)
        return job

    @staticmethod
    def _take(fetched: collections.deque[Any] | None, skipped: list[int]) -> Any:
        while fetched:
            job = fetched.popleft()
            if job[0] not in skipped:
                if job[4] > 1:
                    # A gang's job: the orders after this one must see the gang as it is once this one has
                    # joined it (to join it too), so they pick afresh.
                    fetched.clear()
                return job
        return None


def _fits(
    gpus: bool, capability: float, memory_mb: int, runs_scripts: bool, devices: int
) -> ColumnElement[bool]:
    """The jobs a worker can run: its slowest and smallest GPU (or CPU slots), `devices` of them free."""
    c = jobs.c
    if gpus:
        where = and_(
            c.req_accelerator.in_(("gpu", "any")),
            c.req_devices <= devices,
            c.req_min_capability <= capability,
            c.req_gpu_memory_mb <= memory_mb,
        )
    else:
        # CPU workers: bf16 and memory limits are GPU properties; a CPU slot runs one gloo process.
        where = and_(c.req_accelerator.in_(("cpu", "any")), c.req_devices <= devices)
    # A worker started with --no-scripts never receives the user's own code to run.
    return where if runs_scripts else and_(where, not_(c.req_script))


def _stored_workers(conn: Connection, worker_ids: list[int]) -> dict[int, Any]:
    """Each worker's stored name, inventory and whether it is in a gang now (the gang's rows are read
    only then), by id; workers that are not registered are absent."""
    return {row[0]: row[1:] for row in conn.execute(_WORKERS, {"ids": worker_ids})}


_WORKERS = select(
    workers.c.id, workers.c.name, workers.c.inventory, in_gang(workers.c.id), workers.c.token_hash
).where(workers.c.id.in_(bindparam("ids", expanding=True)))


def _worker(order: ClaimOrder, stored: Any) -> tuple[str, WorkerInventory, bool]:
    """The worker's name, its inventory (UnknownWorker if it has none that is usable) and whether it
    is in a gang; RevokedWorker when it no longer holds the token the claim came with."""
    worker_id = order.worker_id
    if stored is None:
        raise UnknownWorker(worker_id)
    name, raw, in_gang, token_hash = stored
    if token_hash is None or (order.token_hash is not None and order.token_hash != token_hash):
        raise RevokedWorker(worker_id, "was revoked")
    try:
        return name, _inventory(raw), bool(in_gang)
    except ValidationError as exc:  # stored by an older version: registering again replaces it
        raise UnknownWorker(
            worker_id, f"its stored inventory no longer validates ({exc.error_count()} errors)"
        ) from exc


def _all_devices(inventory: WorkerInventory) -> list[int]:
    return [g.index for g in inventory.gpus] if inventory.gpus else list(range(inventory.cpu_slots))


_DEVICES_FIX = "ask for at most as many devices as one worker has (resources.gpus_per_node)"
_RESUBMIT_FIX = "submit the recipe again (POST /jobs): the answer names each field to change"


def _fail_unplannable(conn: Connection, job_id: int, reason: str, fix: str, now: float) -> None:
    """P004: the job cannot be launched on the worker that picked it; it fails with the reason."""
    message = f"the job cannot be launched on the worker that claimed it: {reason}"
    fail_unlaunchable(conn, job_id, code="P004", message=message, fix=fix, now=now)


@functools.lru_cache(maxsize=1024)
def _inventory_of(raw: str) -> WorkerInventory:
    return WorkerInventory.model_validate_json(raw)


def _inventory(raw: Any) -> WorkerInventory:
    """The stored inventory (run_compiled gives SQLite's JSON text, or psycopg's decoded value), parsed
    once per distinct JSON text (workers re-register rarely)."""
    return _inventory_of(raw if isinstance(raw, str) else orjson.dumps(raw).decode())
