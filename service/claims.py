"""The claim: the oldest highest-priority queued job that fits a worker becomes its next attempt.

One transaction per claim, read like the sentence above:
1. pick the job - `SELECT ... WHERE status = 'queued' AND <fits> ORDER BY priority DESC, id LIMIT 1
   FOR UPDATE SKIP LOCKED`. On PostgreSQL the row is locked until the commit and a concurrent claimer
   skips it and takes the next job at once (without SKIP LOCKED it would wait for this transaction and
   then find its row taken). SQLite has no row locks (SQLAlchemy leaves the clause out); there the
   service's write lock serialises claims.
2. plan the launch on this worker's devices (a job that cannot be launched fails with P004, and the
   claim takes the next one);
3. write the attempt and move the job to running through `set_status`, the one status transition.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError
from sqlalchemy import ColumnElement, and_, not_
from sqlmodel import Session, col, select

from service.core.db import Database
from service.inventory import WorkerInventory
from service.jobs import set_status
from service.launch.plan import PlanError, build_launch_plan
from service.models import Attempt, Job, Worker
from service.recipe import Recipe
from service.statuses import JobStatus


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


def claim_next_job(db: Database, order: ClaimOrder, lease_seconds: float) -> dict[str, Any] | None:
    """The attempt `order` gets now, as ClaimedAttempt's fields; None when no queued job fits.

    UnknownWorker and InvalidDevices are raised before anything is written.
    """
    now = time.time()
    with db.write() as session:
        name, inventory = _worker(session, order.worker_id)
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
        next_job = (
            select(Job)
            .where(Job.status == JobStatus.queued.value, fits(inventory, len(free)))
            .order_by(col(Job.priority).desc(), col(Job.id))
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        while (job := session.exec(next_job).first()) is not None:
            assert job.id is not None
            number = job.attempt_count + 1
            try:
                recipe = Recipe.model_validate(job.effective_recipe)
                given = free[: recipe.resources.gpus_per_node]
                plan = build_launch_plan(
                    recipe, inventory, job_id=job.id, attempt_number=number, devices=given
                )
            except PlanError as exc:
                # Failing the job keeps one unlaunchable job from blocking every later claim; take the next.
                _fail_unplannable(session, job, str(exc), _DEVICES_FIX, now)
                continue
            except ValidationError as exc:  # stored under an older schema that no longer accepts it
                _fail_unplannable(session, job, f"its recipe no longer validates: {exc}", _RESUBMIT_FIX, now)
                continue
            plan_json = plan.model_dump(mode="json")
            attempt = Attempt(
                job_id=job.id,
                number=number,
                worker_id=order.worker_id,
                status="running",
                started_at=now,
                lease_expires_at=now + lease_seconds,
                plan=plan_json,
            )
            session.add(attempt)
            session.flush()
            job.attempt_count = number
            job.current_attempt_id = attempt.id
            job.started_at = job.started_at or now
            job.worker_name = name
            # A new attempt starts its progress afresh; the list must not show the last one's.
            job.last_step = job.last_loss = None
            set_status(
                session, job, JobStatus.running, now, f"attempt {number} claimed by {name} (devices {given})"
            )
            return {
                "id": attempt.id,
                "job_id": job.id,
                "number": number,
                "recipe": job.effective_recipe,
                "plan": plan_json,
                "lease_seconds": lease_seconds,
            }
    return None


def fits(inventory: WorkerInventory, devices: int) -> ColumnElement[bool]:
    """The jobs a worker with this inventory and `devices` free can run."""
    if inventory.gpus:
        where = and_(
            col(Job.req_accelerator).in_(("gpu", "any")),
            col(Job.req_devices) <= devices,
            col(Job.req_min_capability) <= min(g.capability for g in inventory.gpus),
            col(Job.req_gpu_memory_mb) <= min(g.memory_mb for g in inventory.gpus),
        )
    else:
        # CPU workers: bf16 and memory limits are GPU properties; a CPU slot runs one gloo process.
        where = and_(col(Job.req_accelerator).in_(("cpu", "any")), col(Job.req_devices) <= devices)
    # A worker started with --no-scripts never receives the user's own code to run.
    return where if inventory.runs_scripts else and_(where, not_(col(Job.req_script)))


def _worker(session: Session, worker_id: int) -> tuple[str, WorkerInventory]:
    """The worker's name and inventory (UnknownWorker if it has none that is usable)."""
    worker = session.get(Worker, worker_id)
    if worker is None:
        raise UnknownWorker(worker_id)
    try:
        return worker.name, _inventory(worker.inventory)
    except ValidationError as exc:  # stored by an older version: registering again replaces it
        raise UnknownWorker(
            worker_id, f"its stored inventory no longer validates ({exc.error_count()} errors)"
        ) from exc


def _all_devices(inventory: WorkerInventory) -> list[int]:
    return [g.index for g in inventory.gpus] if inventory.gpus else list(range(inventory.cpu_slots))


_DEVICES_FIX = "ask for at most as many devices as one worker has (resources.gpus_per_node)"
_RESUBMIT_FIX = "submit the recipe again (POST /jobs): the answer names each field to change"


def _fail_unplannable(session: Session, job: Job, reason: str, fix: str, now: float) -> None:
    """P004: the job cannot be launched on the worker that picked it; it fails with the reason."""
    message = f"the job cannot be launched on the worker that claimed it: {reason}"
    job.failure_class, job.failure_code = "preflight", "P004"
    job.failure_message, job.failure_fix = message, fix
    set_status(session, job, JobStatus.failed, now, message)


@functools.lru_cache(maxsize=1024)
def _inventory_of(raw: str) -> WorkerInventory:
    return WorkerInventory.model_validate_json(raw)


def _inventory(raw: Any) -> WorkerInventory:
    """The stored inventory, parsed once per distinct value (workers re-register rarely)."""
    return _inventory_of(orjson.dumps(raw, option=orjson.OPT_SORT_KEYS).decode())
