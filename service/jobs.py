"""Submitting and cancelling jobs (reading them: service/job_reads.py; their status changes:
service/lifecycle.py)."""

from __future__ import annotations

import time
from typing import Any

from flightdeck.launch.hardware import AMPERE_CAPABILITY
from flightdeck.preflight import run_static_preflight
from flightdeck.preflight.refused_fixes import fixes_the_trainer_refuses
from flightdeck.recipe import Finding, Recipe, RecipeInvalid, expand_stages, parse_recipe
from flightdeck.service.core.db import Database
from flightdeck.service.job_events import record_event
from flightdeck.service.lifecycle import set_status
from flightdeck.service.models import Job
from flightdeck.statuses import JobStatus


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
        raise RecipeInvalid(fixes_the_trainer_refuses(refused.findings, fixes) + findings) from refused
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
