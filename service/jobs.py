"""Submitting, listing, reading and cancelling jobs."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session, col, func, select

from service.core.db import Database
from service.core.sql import execute_many_rows, many_rows_insert, many_rows_update, many_rows_update_order
from service.core.tables import events as events_table
from service.core.tables import jobs as jobs_table
from service.inventory import WorkerInventory
from service.launch.hardware import AMPERE_CAPABILITY
from service.models import (
    Attempt,
    AttemptNode,
    AttemptNodePublic,
    AttemptPublic,
    Event,
    Job,
    JobDetail,
    JobPublic,
    JobsPublic,
    JobSummary,
    MetricPoint,
    Worker,
)
from service.placement import Needs, waiting_reason
from service.preflight import run_static_preflight
from service.recipe import Finding, Recipe, RecipeInvalid, expand_stages, parse_recipe
from service.statuses import JobStatus, check_transition

# Every step record carries a loss (NaN is stored as NULL, still a row): its range is the steps'.
STEP_KEY = "loss"


def requirements(recipe: Recipe) -> dict[str, Any]:
    """What a worker must offer to claim a job, over all of its stages."""
    stages = expand_stages(recipe)
    # A script job is judged only by what it declares: no training section, no precision demand.
    needs_ampere = any(
        (s.training is not None and s.training.precision == "bf16")
        or (s.model is not None and s.model.attn_implementation == "flash_attention_2")
        for s in stages
    )
    return {
        "req_accelerator": recipe.resources.accelerator,
        "req_devices": max(s.resources.gpus_per_node for s in stages),
        "req_min_capability": AMPERE_CAPABILITY if needs_ampere else 0.0,
        "req_gpu_memory_mb": int(max((s.resources.gpu_memory_gb or 0) for s in stages) * 1024),
        "req_script": recipe.is_script,
        "req_nodes": recipe.resources.nodes,
    }


def scheduling_findings(recipe: Recipe) -> list[Finding]:
    """What the scheduler cannot run as asked, whatever the workers."""
    if recipe.resources.nodes > 1 and recipe.stages:
        return [
            Finding(
                path="resources.nodes",
                message=f"a multi-stage recipe runs its stages one after another in one launch; "
                f"{recipe.resources.nodes} nodes cannot each run that launch",
                fix="use nodes: 1 for a multi-stage recipe, or submit each stage as its own job",
            )
        ]
    return []


def validate_submission(payload: Any) -> tuple[Recipe, Recipe, list[Finding]]:
    """(submitted, effective, findings) for a payload, or RecipeInvalid with every finding."""
    recipe = parse_recipe(payload)
    result = run_static_preflight(recipe)
    findings = result.findings + scheduling_findings(recipe)
    if any(f.severity == "error" for f in findings):
        raise RecipeInvalid(findings)
    try:
        # The trainer parses the effective recipe again: a fix must never make one it refuses.
        parse_recipe(result.effective.model_dump(mode="json"))
    except RecipeInvalid as refused:
        fixes = [f for f in result.findings if f.severity == "fix"]

        def field(path: str) -> str:  # 'stages[1].model.device_map' -> 'model.device_map.'
            return path.split("].", 1)[1] + "." if path.startswith("stages[") else path + "."

        problems = []
        for problem in refused.findings:
            # The fixes that wrote this field (or a part of it), else every fix that was applied.
            culprits = [
                f
                for f in fixes
                if f.path
                and (
                    field(problem.path).startswith(field(f.path))
                    or field(f.path).startswith(field(problem.path))
                )
            ] or fixes
            names = ", ".join(dict.fromkeys(f"{f.code} ({f.path}: {f.fix})" for f in culprits)) or "none"
            problems.append(
                Finding(
                    code=culprits[0].code if culprits else problem.code,
                    path=problem.path,
                    message=f"Flightdeck's own preflight fix {names} produced a recipe the trainer would refuse "
                    f"({problem.path}: {problem.message}); this is a Flightdeck bug, not your recipe's, so the job "
                    "was not queued (it could only fail). Apply the fix in the recipe yourself and resubmit, "
                    "and report the bug.",
                )
            )
        raise RecipeInvalid(problems + findings) from refused
    return recipe, result.effective, findings


def submit_job(db: Database, payload: Any, *, priority: int = 0, max_attempts: int = 2) -> Job:
    recipe, effective, findings = validate_submission(payload)
    now = time.time()
    job = Job(
        name=recipe.name,
        status=JobStatus.queued.value,
        priority=priority,
        max_attempts=max_attempts,
        created_at=now,
        updated_at=now,
        recipe=payload,
        effective_recipe=effective.model_dump(mode="json"),
        findings=[f.model_dump(mode="json") for f in findings],
        **requirements(effective),
    )
    with db.write() as session:
        session.add(job)
        session.flush()
        assert job.id is not None
        record_event(session, job.id, None, "status", f"queued with {len(findings)} finding(s)", now=now)
    return job


def record_event(
    session: Session,
    job_id: int,
    attempt_id: int | None,
    kind: str,
    message: str,
    *,
    now: float | None = None,
    code: str | None = None,
    severity: str = "info",
    fix: str | None = None,
    data: dict[str, Any] | None = None,
    key: str | None = None,
) -> None:
    session.add(
        Event(
            job_id=job_id,
            attempt_id=attempt_id,
            key=key,
            kind=kind,
            code=code,
            severity=severity,
            message=message,
            fix=fix,
            data=data or {},
            time=now or time.time(),
        )
    )


class StatusChanged(RuntimeError):
    """The job's stored status was not the one the change was decided on (another writer got there)."""


@dataclass(frozen=True)
class StatusChange:
    """One job's move from `old` to `new`, with the other columns the same change sets (`values`: the
    claim's attempt count, a failure's cause) and the message its event carries."""

    job_id: int
    old: str
    new: JobStatus
    message: str = ""
    attempt_id: int | None = None
    values: dict[str, Any] = field(default_factory=dict)


def change_statuses(conn: Connection, changes: Sequence[StatusChange], now: float) -> None:
    """The one way a job's status changes: checked against the lifecycle (a terminal status never
    changes again), written only if the row still holds `old`, and recorded as an event.

    The guard makes a lost race an error (StatusChanged, the transaction rolls back) instead of a
    silent overwrite: on PostgreSQL another service process may be changing the same job. Changes
    made together (a batch of claims) are written as one statement per set of columns and one for
    their events (`many_rows_update`, `many_rows_insert`): on PostgreSQL a batch of 50 is one
    statement each, not 50.
    """
    dialect = conn.dialect.name
    rows_by_columns: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    for change in changes:
        check_transition(change.old, change.new)
        row = {"status": change.new.value, "updated_at": now, **change.values}
        if change.new.is_terminal():
            row["finished_at"] = now
        # The values it sets, then the row it must find (many_rows_update_order): its id, holding `old`.
        rows_by_columns.setdefault(tuple(row), []).append((*row.values(), change.job_id, change.old))
    for columns, rows in rows_by_columns.items():
        done = execute_many_rows(conn, _guarded_update(dialect, columns), _update_order(columns), rows)
        if done.rowcount != len(rows):
            jobs = sorted(row[-2] for row in rows)[:10]
            old, new = rows[0][-1], rows[0][0]
            raise StatusChanged(
                f"job {jobs[0]} is no longer {old}; its change to {new} was not made"
                if len(rows) == 1
                else f"{len(rows) - done.rowcount} of jobs {jobs} no longer held the status their change was "
                "decided on; none of the changes was made"
            )
    events = [
        (
            change.job_id,
            change.attempt_id,
            "status",
            "info",
            change.message or f"{change.old} -> {change.new.value}",
            "{}",
            now,
        )
        for change in changes
    ]
    execute_many_rows(conn, _status_event(dialect), _EVENT_COLUMNS, events)


def change_status(
    conn: Connection,
    job_id: int,
    old: str,
    new: JobStatus,
    now: float,
    message: str = "",
    *,
    attempt_id: int | None = None,
    values: dict[str, Any] | None = None,
) -> None:
    """change_statuses for one job."""
    change_statuses(conn, [StatusChange(job_id, old, new, message, attempt_id, values or {})], now)


def running(
    job_id: int, *, attempt_id: int, number: int, started_at: float, worker_name: str, message: str
) -> StatusChange:
    """queued -> running for a claimed attempt (one worker's or a gang's): the attempt becomes the
    job's current one and the job's progress starts afresh (the list must not show the last one's).
    `started_at`: when the job's first attempt started."""
    return StatusChange(
        job_id,
        JobStatus.queued.value,
        JobStatus.running,
        message,
        attempt_id,
        {
            "attempt_count": number,
            "current_attempt_id": attempt_id,
            "started_at": started_at,
            "worker_name": worker_name,
            "last_step": None,
            "last_loss": None,
        },
    )


def fail_unlaunchable(
    conn: Connection, job_id: int, *, code: str, message: str, fix: str, now: float
) -> None:
    """queued -> failed for a job a claim found it cannot launch (P004, N001): failing it keeps one
    unlaunchable job from blocking every later claim."""
    change_status(
        conn,
        job_id,
        JobStatus.queued.value,
        JobStatus.failed,
        now,
        message,
        values={
            "failure_class": "preflight",
            "failure_code": code,
            "failure_message": message,
            "failure_fix": fix,
        },
    )


# Built once per dialect and run on the driver (service/core/sql.py): the claim runs these per batch.
_EVENT_COLUMNS = ("job_id", "attempt_id", "kind", "severity", "message", "data", "time")


@functools.cache
def _status_event(dialect: str) -> Any:
    return many_rows_insert(dialect, events_table, _EVENT_COLUMNS)


@functools.lru_cache(maxsize=64)
def _guarded_update(dialect: str, columns: tuple[str, ...]) -> Any:
    """UPDATE jobs SET <columns> WHERE id = <the row's job> AND status = <its old status>, for many rows;
    built once per set of columns."""
    return many_rows_update(dialect, jobs_table, columns, _GUARD)


_GUARD = ("id", "status")


@functools.lru_cache(maxsize=64)
def _update_order(columns: tuple[str, ...]) -> tuple[str, ...]:
    return many_rows_update_order(columns, _GUARD)


def set_status(session: Session, job: Job, new: JobStatus, now: float, message: str = "") -> None:
    """change_status for a job loaded through the ORM; the loaded object then holds what was stored.

    The caller read `job` in this transaction with its row locked (`with_for_update`), so the status
    it decided on is the stored one on PostgreSQL too.
    """
    assert job.id is not None
    session.flush()  # this transaction's other changes (a new attempt's id) reach the database first
    change_status(
        session.connection(), job.id, job.status, new, now, message, attempt_id=job.current_attempt_id
    )
    set_committed_value(job, "status", new.value)
    set_committed_value(job, "updated_at", now)
    if new.is_terminal():
        set_committed_value(job, "finished_at", now)


def cancel_job(db: Database, job_id: int) -> Job | None:
    """Queued: cancelled at once. Running: cancelling until the agent confirms. Terminal: IllegalTransition."""
    with db.write() as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            return None
        now = time.time()
        status = JobStatus(job.status)
        if status is JobStatus.cancelling:
            return job
        target = JobStatus.cancelled if status is JobStatus.queued else JobStatus.cancelling
        set_status(session, job, target, now, "cancel requested" if target is JobStatus.cancelling else "")
        if target is JobStatus.cancelled:
            job.failure_class = "cancelled"
        return job


def public_job(job: Job) -> JobPublic:
    findings = [Finding.model_validate(f) for f in job.findings]
    return JobPublic.model_validate(
        job.model_dump()
        | {"findings": findings, "fixes_applied": [f for f in findings if f.severity == "fix"]}
    )


def job_detail(db: Database, job_id: int, *, lease_seconds: float = 60.0) -> JobDetail | None:
    """The job with its attempts (each with its worker's name) and, while queued, why it waits."""
    with db.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            return None
        attempts = session.exec(
            select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number))
        ).all()
        workers = session.exec(select(Worker).order_by(Worker.name)).all()
        nodes = session.exec(
            select(AttemptNode)
            .where(col(AttemptNode.attempt_id).in_([a.id for a in attempts if a.nnodes > 1]))
            .order_by(col(AttemptNode.node_rank))
        ).all()
        steps: dict[int | None, tuple[int | None, int | None]] = {
            a.id: step_range(session, a.id) for a in attempts if a.id is not None
        }
    names = {w.id: w.name for w in workers}
    by_attempt: dict[int | None, list[AttemptNodePublic]] = {}
    for node in nodes:
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
                if now - w.last_seen_at < lease_seconds:
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
                    | {"worker_name": names.get(a.worker_id), "nodes": by_attempt.get(a.id, [])}
                    | dict(zip(("first_step", "last_step"), steps.get(a.id, (None, None)), strict=True))
                )
                for a in attempts
            ],
            "waiting": waiting,
        }
    )


def step_range(session: Session, attempt_id: int) -> tuple[int | None, int | None]:
    """The attempt's first and last step with a loss: two index lookups (min and max of one key's
    range), whatever the number of points."""
    where = (col(MetricPoint.attempt_id) == attempt_id, col(MetricPoint.key) == STEP_KEY)
    first = session.exec(select(func.min(MetricPoint.step)).where(*where)).one()
    last = session.exec(select(func.max(MetricPoint.step)).where(*where)).one()
    return first, last


def job_needs(job: Job) -> Needs:
    return Needs(
        accelerator=job.req_accelerator,
        devices=job.req_devices,
        min_capability=job.req_min_capability,
        gpu_memory_mb=job.req_gpu_memory_mb,
        script=job.req_script,
        nodes=job.req_nodes,
    )


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
    summaries = [
        JobSummary.model_validate(j.model_dump(include=_SUMMARY_FIELDS) | {"findings_count": len(j.findings)})
        for j in page
    ]
    return JobsPublic(data=summaries, count=len(page), next_cursor=next_cursor)


# A list row never carries the recipes: five 8 MB recipes in a list were 80 MB per dashboard poll.
_SUMMARY_FIELDS = {"id", *JobSummary.model_fields} - {"findings_count"}
