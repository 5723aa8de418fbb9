"""What a Slurm executor leaves on disk so that, restarted, it finds its Slurm jobs again.

The worker's identity (its id and own token, kept so the jobs' runners, which hold that token, go on
reporting) in a file readable by its owner only, and in each attempt's job directory the Slurm job id
and, once the attempt's end was reported, a mark that it needs no watching.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightdeck.worker.agent.run_attempt import AttemptDescription, read_description

# In each attempt's job directory (`job_dir`: <runs>/<database>/slurm/<attempt id>/).
SLURM_JOB_ID_FILE = "slurm_job_id"
SETTLED_FILE = "settled"
DESCRIPTION_FILE = "attempt.json"


@dataclass(frozen=True)
class SavedIdentity:
    worker_id: str
    token: str
    database: str = ""  # the service's database it registered with ("" in a file written before ids)


def default_state_file(name: str, service_url: str) -> Path:
    """Outside the workspace and runs directory, which recipes may name (S001). One file per worker name
    and service: two executors of one name on one host, registered with two services (a staging and a
    production one), each keep their own identity instead of overwriting the other's."""
    digest = hashlib.sha256(service_url.encode()).hexdigest()[:8]
    return _state_dir() / f"{name}-{digest}.json"


def earlier_default_state_file(name: str) -> Path:
    """Where a release before the per-service name kept it: read when the per-service file is not there,
    so an upgraded executor is still the same worker (load_identity checks the name and service)."""
    return _state_dir() / f"{name}.json"


def _state_dir() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "flightdeck"


def save_identity(
    path: Path, *, name: str, service_url: str, worker_id: str, token: str, database: str
) -> None:
    """Write (atomically, mode 0600) the identity a restarted executor registers with."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        identity = {"name": name, "service_url": service_url, "worker_id": worker_id, "token": token}
        json.dump(identity | {"database": database}, file)
    os.replace(partial, path)


def load_identity(path: Path, *, name: str, service_url: str) -> SavedIdentity | None:
    """The identity saved by an earlier life of this worker (same name, same service), if any."""
    try:
        saved = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(saved, dict) or saved.get("name") != name or saved.get("service_url") != service_url:
        return None
    worker_id, token = saved.get("worker_id"), saved.get("token")
    if not isinstance(worker_id, str) or not isinstance(token, str) or not token:
        return None
    database = saved.get("database")
    return SavedIdentity(worker_id, token, database if isinstance(database, str) else "")


def forget_identity(path: Path, *, name: str, service_url: str) -> None:
    """Remove the identity at `path` if it is this worker's for this service (load_identity's test)."""
    if load_identity(path, name=name, service_url=service_url) is not None:
        path.unlink(missing_ok=True)


def described_attempt(job_dir: Path) -> dict[str, Any] | None:
    """The attempt a job directory was written for, as attempt.json names one in a run directory
    ({attempt_id, claimed_at}); None without a readable description."""
    try:
        attempt = json.loads((job_dir / DESCRIPTION_FILE).read_text()).get("attempt") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return {"attempt_id": attempt.get("id"), "claimed_at": attempt.get("claimed_at")}


def record_slurm_job(job_dir: Path, slurm_job_id: str) -> None:
    (job_dir / SLURM_JOB_ID_FILE).write_text(slurm_job_id)


def recorded_slurm_job(job_dir: Path) -> str:
    try:
        return (job_dir / SLURM_JOB_ID_FILE).read_text().strip()
    except FileNotFoundError:
        return ""


def mark_settled(job_dir: Path) -> None:
    """The attempt's end was reported (or handed to the service): a restarted executor leaves it be."""
    if job_dir.is_dir():
        (job_dir / SETTLED_FILE).touch()


def job_dir(run_dir: str | Path, attempt_id: str) -> Path:
    """The job directory of the attempt whose (node 0) run directory is `run_dir`: `slurm/<attempt id>`
    in the database's folder beside it. Attempt ids start again at 1 in a fresh database: a job directory
    keyed by the id alone was the old database's, and its `settled` mark hid the new attempt from a
    restarted executor (its lease then ran out while its Slurm job ran on: the job ran twice)."""
    return Path(run_dir).parent / "slurm" / str(attempt_id)


def database_of(job_dir: Path, runs_dir: str | Path) -> str:
    """The database whose folder holds a job directory; "" in the layout before database folders."""
    folder = job_dir.parent.parent
    return "" if folder.resolve() == Path(runs_dir).resolve() else folder.name


def unsettled_attempts(
    runs_dir: Path, agent_name: str, database: str = ""
) -> list[tuple[Path, AttemptDescription]]:
    """This worker's attempts whose end no life of the executor reported: (job directory, description).

    In the folder of `database`, the one its saved identity registered with: another database's attempt
    7 is not this database's attempt 7. Without one (a first start, or an identity saved before database
    ids), in every database's folder: the service then stops them all at the first registration."""
    found = []
    # `slurm/<attempt>`: the layout before database folders, whose Slurm jobs may still run at an upgrade.
    layouts = (f"{database or '*'}/slurm/*/{DESCRIPTION_FILE}", f"slurm/*/{DESCRIPTION_FILE}")
    for description in (p for layout in layouts for p in sorted(runs_dir.glob(layout))):
        job_dir = description.parent
        if (job_dir / SETTLED_FILE).exists():
            continue
        try:
            read = read_description(description)
        except SystemExit:  # a description cut short by a crash while it was written
            continue
        if read.agent_name == agent_name:
            found.append((job_dir, read))
    return found
