"""Checkpoints a retry can resume from: when one counts as complete, and where a retry finds it.

The trainer (and `FlightdeckCallback` in a script's HF Trainer) writes `flightdeck-checkpoint.json`
into each checkpoint directory LAST, once every rank's files are on disk: the step and every file with
its size. A checkpoint counts only when that marker is there, every file it lists still has its size,
and the adapter (when the checkpoint holds one) holds tensors. Anything else (a save killed half-way, a
file truncated since, an adapter written empty) is partial: a retry skips it with a warning (G016) and
takes the newest complete one before it.

Where: every attempt has its own run directory, `<runs_dir>/<database>/job-<id>-attempt-<n>` (node 0's; rank 0
writes the checkpoints there), under `output/` (the trainer's `output/stage-<i>/checkpoint-<step>`, a
script's `{output_dir}/.../checkpoint-<step>`). A retry looks in the run directories of the job's
earlier attempts in its own runs directory: agents of one host that share `--runs-dir`, hosts that
mount one shared runs directory, and a Slurm executor's runs directory on the cluster's shared
filesystem all see them. Needs only the standard library and safetensors (no torch), so the agent
imports it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from flightdeck.contracts import ATTEMPT_FILE
from flightdeck.run_variables import RESUME_VARIABLE

__all__ = ["MARKER_FILE", "RESUME_VARIABLE", "find_resume_point", "incomplete_because", "mark_complete"]

MARKER_FILE = "flightdeck-checkpoint.json"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# How deep under a run's output/ a checkpoint directory may sit (stage-<i>/checkpoint-<n> is 2).
SEARCH_DEPTH = 3
# Node 0's run directory has no -node-<k>: rank 0 writes every checkpoint there.
_ATTEMPT_DIR = re.compile(r"^job-(?P<job>.+?)-attempt-(?P<number>\d+)(?P<node>-node-\d+)?$")


def mark_complete(directory: Path, step: int) -> Path:
    """Write the completion marker of `directory` (call it after every file of the save is written,
    on one process): the step and each file's size, atomically, so a reader never sees half of it."""
    files = {
        str(path.relative_to(directory)): path.stat().st_size
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != MARKER_FILE and not path.name.endswith(".tmp")
    }
    marker = directory / MARKER_FILE
    tmp = marker.with_name(marker.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump({"step": int(step), "files": files}, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, marker)
    return marker


def incomplete_because(directory: Path) -> str | None:
    """Why the checkpoint in `directory` is not complete; None when it is."""
    try:
        marker = json.loads((directory / MARKER_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {MARKER_FILE}: the save did not finish"
    except (OSError, ValueError) as exc:
        return f"{MARKER_FILE} unreadable ({exc})"
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{MARKER_FILE} lists no files"
    for name, size in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} when saved"
    if (directory / ADAPTER_CONFIG).is_file():
        return _adapter_problem(directory)
    return None


def _adapter_problem(directory: Path) -> str | None:
    """The adapter of a checkpoint must hold tensors, none of them empty (what G014 checks at save)."""
    safetensors = directory / ADAPTER_FILES[0]
    if safetensors.is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(safetensors), framework="numpy") as adapter:
                shapes = [adapter.get_slice(key).get_shape() for key in adapter.keys()]  # noqa: SIM118
        except Exception as exc:  # a truncated header, not safetensors at all
            return f"{safetensors.name} unreadable ({exc})"
    elif (directory / ADAPTER_FILES[1]).is_file():
        import torch

        try:
            tensors = torch.load(directory / ADAPTER_FILES[1], map_location="cpu", weights_only=True)
        except Exception as exc:
            return f"{ADAPTER_FILES[1]} unreadable ({exc})"
        shapes = [list(t.shape) for t in tensors.values()]
    else:
        return f"{ADAPTER_CONFIG} without an adapter file ({' or '.join(ADAPTER_FILES)})"
    if not shapes:
        return "the adapter file holds no tensors"
    empty = sum(1 for shape in shapes if 0 in shape)
    if empty:
        return f"{empty} of the adapter's {len(shapes)} tensors are empty (0-sized)"
    return None


def checkpoint_step(directory: Path) -> int | None:
    found = CHECKPOINT_NAME.match(directory.name)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    attempt: int  # the number of the attempt that saved it


@dataclass
class ResumeSearch:
    """What a retry found among its job's earlier attempts: the checkpoint to resume from (the one with
    the most steps; the later attempt's on a tie), and the partial ones it skipped, with why."""

    found: Checkpoint | None = None
    skipped: list[tuple[Checkpoint, str]] = field(default_factory=list)


def earlier_run_dirs(run_dir: Path, job_started_at: float | None = None) -> list[tuple[int, Path]]:
    """(number, run directory) of the attempts of the same job before the one of `run_dir`, newest first.

    `job_started_at` (when the job's first attempt was made, as the claim says) leaves out a directory of
    the same name whose attempt.json names another: a database restored from a backup makes the job and
    its attempts again under the same ids, and an attempt of the lost timeline that ran on this host
    (while this timeline's attempt of that number ran elsewhere) left its checkpoints there. The value
    is compared as the service stored it, never against another clock: service replicas' clocks differ.
    """
    this = _ATTEMPT_DIR.match(run_dir.name)
    if this is None or not run_dir.parent.is_dir():
        return []
    earlier = []
    for sibling in run_dir.parent.iterdir():
        other = _ATTEMPT_DIR.match(sibling.name)
        if (
            other
            and not other["node"]
            and other["job"] == this["job"]
            and int(other["number"]) < int(this["number"])
            and not _another_run_of_the_job(sibling, job_started_at)
        ):
            earlier.append((int(other["number"]), sibling))
    return sorted(earlier, reverse=True)


def _another_run_of_the_job(run_dir: Path, job_started_at: float | None) -> bool:
    """Whether the attempt.json in `run_dir` names another `job_started_at` than this one; a directory
    that names none (written by an earlier release, or never prepared) is taken for this run's."""
    if job_started_at is None:
        return False
    try:
        recorded = json.loads((run_dir / ATTEMPT_FILE).read_text()).get("job_started_at")
    except (OSError, ValueError, AttributeError):
        return False
    return recorded is not None and recorded != job_started_at


def _checkpoint_dirs(output: Path) -> list[Path]:
    found = []
    for depth in range(1, SEARCH_DEPTH + 1):
        pattern = "/".join(["*"] * depth)
        found += [p for p in output.glob(pattern) if p.is_dir() and CHECKPOINT_NAME.match(p.name)]
    return found


def find_resume_point(
    run_dir: Path, output_dir: str = "output", job_started_at: float | None = None
) -> ResumeSearch:
    """The newest complete checkpoint among the earlier attempts of `run_dir`'s job (see the module and
    earlier_run_dirs for `job_started_at`)."""
    search = ResumeSearch()
    for number, earlier in earlier_run_dirs(run_dir, job_started_at):
        for path in _checkpoint_dirs(earlier / output_dir):
            checkpoint = Checkpoint(path, checkpoint_step(path) or 0, number)
            problem = incomplete_because(path)
            if problem is not None:
                search.skipped.append((checkpoint, problem))
            elif search.found is None or checkpoint.step > search.found.step:
                search.found = checkpoint
    # A partial one with fewer steps than the one taken would not have been used anyway: not news.
    best = search.found.step if search.found else -1
    search.skipped = sorted(
        ((c, why) for c, why in search.skipped if c.step > best), key=lambda item: -item[0].step
    )
    return search
