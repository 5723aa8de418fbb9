"""Claims: many agents' claims written in one transaction (group commit), each job taken once.

A claim is one guarded UPDATE (procrastinate's pattern): pick the best fitting queued job and mark
it running in the same statement, so two claims can never take the same job. Claims that arrive
together are served in arrival order inside one write transaction: the commit, the thread hop and
the lock are paid once per batch instead of once per claim, which is what keeps claim latency low
when fifty agents claim at once (bench/README.md has the numbers).

The statements are plain sqlite3 on the write connection: the ORM cost more per claim (about
1.5 ms) than the SQL it ran.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from service.contracts import ClaimedAttempt
from service.core.db import Database
from service.inventory import WorkerInventory
from service.launch.plan import PlanError, build_launch_plan
from service.recipe import Recipe
from service.statuses import JobStatus, check_transition, sources_for


@dataclass(frozen=True)
class ClaimOrder:
    """One agent asking for a job: its worker id, and the devices it has free (None: all of them)."""

    worker_id: int
    devices: list[int] | None = None


class InvalidDevices(ValueError):
    """The claim names devices the worker never registered, or one twice: the API answers 422."""


class UnknownWorker(LookupError):
    """The API answers 404 with 'register again'."""

    def __init__(self, worker_id: int, why: str = "is not registered"):
        super().__init__(f"worker {worker_id} {why}")


# A claimed attempt travels as the dict of ClaimedAttempt's fields: it is built from values already
# checked, and constructing the model per claim cost more than the claim's SQL.
ClaimResult = dict[str, Any] | None | Exception

_SOURCES = ", ".join(f"'{s}'" for s in sources_for(JobStatus.running))
_INSERT_ATTEMPT = (
    "INSERT INTO attempts (job_id, number, worker_id, status, started_at, lease_expires_at, plan, findings) "
    "VALUES (?, ?, ?, 'running', ?, ?, ?, '[]') RETURNING id"
)
_INSERT_EVENT = (
    "INSERT INTO events (job_id, attempt_id, kind, severity, message, data, time) "
    "VALUES (?, ?, 'status', 'info', ?, '{}', ?)"
)


def claim_jobs(db: Database, orders: list[ClaimOrder], lease_seconds: float) -> list[ClaimResult]:
    """Serve `orders` in order in one transaction: each gets an attempt, None (nothing fits) or an error.

    An error that belongs to one order (an unknown worker) is that order's result and does not undo
    the others; anything else rolls the whole batch back and is raised.
    """
    now = time.time()
    results: list[ClaimResult] = []
    with db.raw_write() as conn:
        workers: dict[int, tuple[str, WorkerInventory] | Exception] = {}
        for order in orders:
            if order.worker_id not in workers:
                workers[order.worker_id] = _worker(conn, order.worker_id)
            worker = workers[order.worker_id]
            if isinstance(worker, Exception):
                results.append(worker)
                continue
            results.append(_claim_one(conn, order, worker, lease_seconds, now))
    return results


def claim_next_job(
    db: Database, worker_id: int, devices: list[int] | None, lease_seconds: float
) -> ClaimedAttempt | None:
    """One claim on its own (a batch of one): the oldest highest-priority queued job that fits."""
    [result] = claim_jobs(db, [ClaimOrder(worker_id, devices)], lease_seconds)
    if isinstance(result, Exception):
        raise result
    return None if result is None else ClaimedAttempt.model_validate(result)


def _worker(conn: Any, worker_id: int) -> tuple[str, WorkerInventory] | Exception:
    """The worker's name and inventory, or the error its own claims get (before anything is written)."""
    found = conn.execute("SELECT name, inventory FROM workers WHERE id = ?", (worker_id,)).fetchone()
    if found is None:
        return UnknownWorker(worker_id)
    try:
        return found[0], _inventory(found[1])
    except ValidationError as exc:  # stored by an older version: registering again replaces it
        return UnknownWorker(
            worker_id, f"its stored inventory no longer validates ({exc.error_count()} errors)"
        )


def _claim_one(
    conn: Any, order: ClaimOrder, worker: tuple[str, WorkerInventory], lease_seconds: float, now: float
) -> dict[str, Any] | InvalidDevices | None:
    worker_name, inventory = worker
    registered = _all_devices(inventory)
    if order.devices is not None and (
        len(set(order.devices)) != len(order.devices) or not set(order.devices) <= set(registered)
    ):
        # Only devices the worker registered, each once: the plan must never name another GPU.
        return InvalidDevices(
            f"devices {sorted(order.devices)[:16]} are not distinct devices of this worker's inventory "
            f"{registered[:16]}; send the indices it registered, each once"
        )
    free = order.devices if order.devices is not None else registered
    fits, params = _fits_clause(inventory, len(free))
    while True:
        row = conn.execute(
            "UPDATE jobs SET status = 'running', attempt_count = attempt_count + 1, updated_at = :now, "
            "started_at = coalesce(started_at, :now), worker_name = :worker_name, "
            # A new attempt starts its progress afresh; the list must not show the last one's.
            "last_step = NULL, last_loss = NULL "
            f"WHERE id = (SELECT id FROM jobs WHERE status = 'queued' AND {fits} "
            f"ORDER BY priority DESC, id ASC LIMIT 1) AND status IN ({_SOURCES}) "
            "RETURNING id, attempt_count, effective_recipe",
            params | {"now": now, "worker_name": worker_name},
        ).fetchone()
        if row is None:
            return None
        job_id, number, raw_recipe = row
        effective = orjson.loads(raw_recipe)
        try:
            recipe = Recipe.model_validate(effective)
            given = free[: recipe.resources.gpus_per_node]
            plan = build_launch_plan(recipe, inventory, job_id=job_id, attempt_number=number, devices=given)
        except PlanError as exc:
            # Failing the job keeps one unlaunchable job from blocking every later claim; take the next.
            _fail_unplannable(conn, job_id, str(exc), _DEVICES_FIX, now)
            continue
        except ValidationError as exc:  # stored under an older schema that no longer accepts it
            _fail_unplannable(conn, job_id, f"its recipe no longer validates: {exc}", _RESUBMIT_FIX, now)
            continue
        plan_json = plan.model_dump(mode="json")
        (attempt_id,) = conn.execute(
            _INSERT_ATTEMPT,
            (job_id, number, order.worker_id, now, now + lease_seconds, orjson.dumps(plan_json).decode()),
        ).fetchone()
        conn.execute("UPDATE jobs SET current_attempt_id = ? WHERE id = ?", (attempt_id, job_id))
        conn.execute(
            _INSERT_EVENT,
            (job_id, attempt_id, f"attempt {number} claimed by {worker_name} (devices {given})", now),
        )
        return {
            "id": attempt_id,
            "job_id": job_id,
            "number": number,
            "recipe": effective,
            "plan": plan_json,
            "lease_seconds": lease_seconds,
        }


def _fits_clause(inventory: WorkerInventory, devices: int) -> tuple[str, dict[str, Any]]:
    where, params = _device_clause(inventory, devices)
    # A worker started with --no-scripts never receives the user's own code to run.
    return (where if inventory.runs_scripts else f"{where} AND NOT req_script"), params


def _device_clause(inventory: WorkerInventory, devices: int) -> tuple[str, dict[str, Any]]:
    if inventory.gpus:
        capability = min(g.capability for g in inventory.gpus)
        memory_mb = min(g.memory_mb for g in inventory.gpus)
        where = (
            "req_accelerator IN ('gpu', 'any') AND req_devices <= :devices "
            "AND req_min_capability <= :capability AND req_gpu_memory_mb <= :memory_mb"
        )
        return where, {"devices": devices, "capability": capability, "memory_mb": memory_mb}
    # CPU workers: bf16 and memory limits are GPU properties; a CPU slot runs one gloo process.
    return "req_accelerator IN ('cpu', 'any') AND req_devices <= :devices", {"devices": devices}


def _all_devices(inventory: WorkerInventory) -> list[int]:
    return [g.index for g in inventory.gpus] if inventory.gpus else list(range(inventory.cpu_slots))


_DEVICES_FIX = "ask for at most as many devices as one worker has (resources.gpus_per_node)"
_RESUBMIT_FIX = "submit the recipe again (POST /jobs): the answer names each field to change"


def _fail_unplannable(conn: Any, job_id: int, reason: str, fix: str, now: float) -> None:
    """P004: the job was just marked running by this claim; it fails with the reason instead."""
    check_transition(JobStatus.running, JobStatus.failed)  # the lifecycle allows it; keep it the judge
    message = f"the job cannot be launched on the worker that claimed it: {reason}"
    conn.execute(
        "UPDATE jobs SET status = 'failed', failure_class = 'preflight', failure_code = 'P004', "
        "failure_message = ?, failure_fix = ?, updated_at = ?, finished_at = ? WHERE id = ?",
        (message, fix, now, now, job_id),
    )
    conn.execute(_INSERT_EVENT, (job_id, None, message, now))


@functools.lru_cache(maxsize=1024)
def _inventory_of(raw: str) -> WorkerInventory:
    return WorkerInventory.model_validate_json(raw)


def _inventory(raw: Any) -> WorkerInventory:
    """The stored inventory, parsed once per distinct JSON text (workers re-register rarely)."""
    return _inventory_of(raw if isinstance(raw, str) else bytes(raw).decode())
