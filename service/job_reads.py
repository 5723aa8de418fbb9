"""Reading jobs: the list (a cursor of summaries) and one job's detail with its attempts, nodes and,
while it is queued, why it waits."""

from __future__ import annotations

import time

from pydantic import ValidationError
from sqlmodel import Session, col, func, select

from flightdeck.inventory import WorkerInventory
from flightdeck.recipe import Finding
from flightdeck.service.core.db import Database
from flightdeck.service.models import (
    Attempt,
    AttemptNode,
    AttemptNodePublic,
    AttemptPublic,
    Job,
    JobDetail,
    JobPublic,
    JobsPublic,
    JobSummary,
    MetricPoint,
    Worker,
)
from flightdeck.service.why_waiting import Needs, waiting_reason
from flightdeck.service.worker_liveness import is_alive
from flightdeck.statuses import JobStatus

# Every step record carries a loss (NaN is stored as NULL, still a row): its range is the steps'.
STEP_KEY = "loss"


def public_job(job: Job) -> JobPublic:
    findings = [Finding.model_validate(f) for f in job.findings]
    return JobPublic.model_validate(
        job.model_dump()
        | {"findings": findings, "fixes_applied": [f for f in findings if f.severity == "fix"]}
    )


def job_detail(db: Database, job_id: int, *, lease_seconds: float = 60.0) -> JobDetail | None:
    """The job with its attempts (each with its worker's name) and, while queued, why it waits.

    Read in one snapshot: an attempt that ends commits its own row and its job's together, and read
    statement by statement a poll between the two reads gave a job still running whose attempt had
    succeeded (or the other way round)."""
    with db.read(snapshot=True) as session:
        job = session.get(Job, job_id)
        if job is None:
            return None
        attempts = session.exec(
            select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number))
        ).all()
        workers = session.exec(select(Worker).order_by(Worker.name)).all()
        nodes = session.exec(
            select(AttemptNode)
            .where(col(AttemptNode.attempt_id).in_([a.id for a in attempts]))
            .order_by(col(AttemptNode.node_rank))
        ).all()
        steps: dict[int | None, tuple[int | None, int | None]] = {
            a.id: step_range(session, a.id) for a in attempts if a.id is not None
        }
    names = {w.id: w.name for w in workers}
    by_attempt: dict[int | None, list[AttemptNodePublic]] = {}
    leases: dict[int | None, float] = {}
    for node in nodes:
        if node.lease_expires_at is not None:
            # The attempt's lease is its first node's to run out (the reaper then ends that node).
            leases[node.attempt_id] = min(
                node.lease_expires_at, leases.get(node.attempt_id, node.lease_expires_at)
            )
        report = node.report or {}
        by_attempt.setdefault(node.attempt_id, []).append(
            AttemptNodePublic(
                node_rank=node.node_rank or 0,
                worker_id=node.worker_id,
                worker_name=names.get(node.worker_id),
                address=node.address,
                devices=node.devices,
                status=node.status,
                message=report.get("message"),
            )
        )
    waiting = None
    if job.status == JobStatus.queued.value:
        now = time.time()
        live = []
        for w in workers:
            try:
                if is_alive(w, now, lease_seconds):
                    live.append((w.name, WorkerInventory.model_validate(w.inventory)))
            except ValidationError:
                continue  # stored by an older agent; it registers again when it restarts
        waiting = waiting_reason(job_needs(job), live)
    return JobDetail.model_validate(
        public_job(job).model_dump()
        | {
            "attempts": [
                AttemptPublic.model_validate(
                    a.model_dump()
                    | {
                        "worker_name": names.get(a.worker_id),
                        "nodes": by_attempt.get(a.id, []),
                        "lease_expires_at": leases.get(a.id),
                    }
                    | dict(zip(("first_step", "last_step"), steps.get(a.id, (None, None)), strict=True))
                )
                for a in attempts
            ],
            "waiting": waiting,
        }
    )


def job_needs(job: Job) -> Needs:
    return Needs(
        accelerator=job.req_accelerator,
        devices=job.req_devices,
        min_capability=job.req_min_capability,
        gpu_memory_mb=job.req_gpu_memory_mb,
        script=job.req_script,
        nodes=job.req_nodes,
    )


def step_range(session: Session, attempt_id: int) -> tuple[int | None, int | None]:
    """The attempt's first and last step with a loss: two index lookups (min and max of one key's
    range), whatever the number of points."""
    where = (col(MetricPoint.attempt_id) == attempt_id, col(MetricPoint.key) == STEP_KEY)
    first = session.exec(select(func.min(MetricPoint.step)).where(*where)).one()
    last = session.exec(select(func.max(MetricPoint.step)).where(*where)).one()
    return first, last


def list_jobs(db: Database, *, status: str | None, before: int | None, limit: int) -> JobsPublic:
    """Newest first; `before` is the cursor (the last id of the previous page)."""
    query = select(Job).order_by(col(Job.id).desc()).limit(limit + 1)
    if status:
        query = query.where(Job.status == status)
    if before is not None:
        query = query.where(col(Job.id) < before)
    with db.read() as session:
        rows = list(session.exec(query).all())
    page = rows[:limit]
    next_cursor = page[-1].id if len(rows) > limit and page else None
    return JobsPublic(data=[job_summary(j) for j in page], count=len(page), next_cursor=next_cursor)


def job_summary(job: Job) -> JobSummary:
    """A job as lists and the live streams' `status` events show it: its state, not its recipes."""
    return JobSummary.model_validate(
        job.model_dump(include=_SUMMARY_FIELDS) | {"findings_count": len(job.findings)}
    )


# A list row never carries the recipes: five 8 MB recipes in a list were 80 MB per dashboard poll.
_SUMMARY_FIELDS = {"id", *JobSummary.model_fields} - {"findings_count"}
