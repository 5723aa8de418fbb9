"""Where a retried attempt resumes: the newest complete checkpoint of its job's earlier attempts.

The runner resolves it on the host, before launch (the service cannot see the files): the trainer gets
it as FLIGHTDECK_RESUME_FROM and passes it to the Trainer's `resume_from_checkpoint`; a script job gets
the same variable and `{resume_from}` in its args. Partial checkpoints it passed over are reported
(G016), and so is the one it resumes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightdeck.contracts import RESUME_PLACE, attempt_event
from flightdeck.worker.checkpoints import MARKER_FILE, find_resume_point

PARTIAL_FIX = (
    "nothing to do for this run (it resumed from the newest complete checkpoint, or started over); if "
    "saves are cut short often, give the attempt a longer stop grace (--cancel-grace, the Slurm worker's "
    f"--slurm-warning-seconds) so the save finishes before the kill; a script writes {MARKER_FILE} last "
    "(flightdeck.worker.checkpoints.mark_complete)"
)


@dataclass
class Resume:
    """The checkpoint path ("" when the attempt starts from step 0) and the events that say why."""

    path: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)


def resolve_resume(run_dir: Path, attempt_number: int, job_started_at: float | None = None) -> Resume:
    """The resume point of attempt `attempt_number`, whose run directory is `run_dir`, among the earlier
    attempts of this run of its job (the claim's `job_started_at`; None from an older service: every
    sibling; worker/checkpoints.py earlier_run_dirs)."""
    if attempt_number <= 1:
        return Resume()
    search = find_resume_point(run_dir, job_started_at=job_started_at)
    resume = Resume(path=str(search.found.path) if search.found else "")
    for checkpoint, why in search.skipped:
        resume.events.append(
            attempt_event(
                f"resume:partial:{checkpoint.path}",
                "resume",
                f"checkpoint-{checkpoint.step} of attempt {checkpoint.attempt} is partial, skipped: {why}",
                code="G016",
                severity="warn",
                fix=PARTIAL_FIX,
                data={"checkpoint": str(checkpoint.path), "step": checkpoint.step, "why": why},
            )
        )
    if search.found is not None:
        found = search.found
        message = (
            f"resuming from checkpoint-{found.step} of attempt {found.attempt} "
            f"(optimizer, scheduler, RNG and data position): the first step is {found.step + 1}"
        )
        data = {"checkpoint": resume.path, "step": found.step, "attempt": found.attempt}
    else:
        message = "no complete checkpoint from an earlier attempt: training starts from step 0"
        data = {"checkpoint": None}
    resume.events.append(attempt_event("resume:from", "resume", message, data=data))
    return resume


def fill_resume_place(argv: list[str], resume_from: str) -> list[str]:
    """A script's args with `{resume_from}` replaced (an empty string when there is none)."""
    return [arg.replace(RESUME_PLACE, resume_from) for arg in argv]
