"""How a Slurm job's end becomes the attempt's outcome, with a cause and a fix.

Slurm's own requeue is off for Flightdeck's jobs (`--no-requeue`): a node failure, a time limit or a
preemption ends the attempt here with its cause, so nothing hides a failure (Flightdeck's retry policy,
service/attempt_endings.py, decides what runs again: a node failure and a preemption are retried while the job
has attempts left, and the retry waits in Slurm's queue until nodes are back).
"""

from __future__ import annotations

from flightdeck.worker.agent.classify import Outcome
from flightdeck.worker.slurm.commands import JobState

# States in which a job will not run again.
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "NODE_FAIL",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)

# Ends that the runner inside the job cannot report: Slurm stopped it from outside.
_SLURM_ENDS = {
    "NODE_FAIL": (
        "node_failure",
        "node {nodes} failed while running Slurm job {job_id} ({reason})",
        "Submit the job again (Slurm places it on a healthy node); if a node fails repeatedly, ask "
        "the cluster admin to drain it (`scontrol update NodeName=... State=DRAIN Reason=...`).",
    ),
    "BOOT_FAIL": (
        "node_failure",
        "Slurm could not boot node {nodes} for job {job_id} ({reason})",
        "Submit the job again; tell the cluster admin which node failed to boot.",
    ),
    "TIMEOUT": (
        "timeout",
        "Slurm job {job_id} reached its time limit on {nodes}",
        "Raise the time limit (`flightdeck worker --executor slurm --slurm-time`, within the "
        "partition's MaxTime) or lower training.max_steps.",
    ),
    "DEADLINE": (
        "timeout",
        "Slurm job {job_id} reached its deadline on {nodes}",
        "Submit with a later --deadline, or none.",
    ),
    "OUT_OF_MEMORY": (
        "oom",
        "Slurm's memory limit killed job {job_id} on {nodes}",
        "Ask for more memory per node (`--slurm-option=--mem=...`) or lower training.batch_size.",
    ),
    "PREEMPTED": (
        "preempted",
        "Slurm preempted job {job_id} on {nodes} for a job of higher priority",
        "Submit the job again; use a QOS or partition without preemption (`--slurm-qos`) for jobs "
        "that must not be interrupted.",
    ),
    "CANCELLED": (
        "cancelled",
        "Slurm job {job_id} was cancelled outside Flightdeck ({reason})",
        "Someone ran scancel or an admin ended it; submit the job again if it should run.",
    ),
}


def slurm_outcome(job: JobState, log_tail: str = "", failed_nodes: list[str] | None = None) -> Outcome:
    """The outcome of a job Slurm ended from outside (not one whose runner reported); `failed_nodes`:
    those of its nodes Slurm has as down (a job of several nodes names the one that failed)."""
    failure_class, message, fix = _SLURM_ENDS.get(
        job.state,
        (
            "runner",
            "Slurm job {job_id} ended {state} on {nodes} before the attempt runner reported",
            "Read the Slurm output file in the worker's runs directory (<database>/slurm/<attempt>/slurm-<job>.out).",
        ),
    )
    text = message.format(
        job_id=job.job_id,
        nodes=",".join(failed_nodes or []) or job.nodes or "(none)",
        reason=job.reason or "no reason given",
        state=job.state,
    )
    return Outcome(
        "cancelled" if failure_class == "cancelled" else "failed",
        exit_code=job.exit_code,
        failure_class=failure_class,
        message=f"{text}: {job.described}",
        fix=fix,
        log_tail=log_tail[-4000:],
    )
