"""What a script job wrote in the workspace outside its run directory (H009, a warning).

A script runs in its attempt's directory, but it can still write anywhere by path: a checkpoint saved
to `{workspace}/checkpoints`, a `snapshot.pt` next to the script. The next run of the same script
then sees it (the resume-by-accident of issue 33). The agent lists the workspace's files (size and
mtime) before launch and after the end, and names what is new or changed.

Bounded in cost: the run's own directory, the runs directory, dot-directories and `__pycache__`
(Python's bytecode for the script's imports) are not walked, a directory with more than
`MAX_ENTRIES_PER_DIR` entries is taken as one entry (its own mtime: a file added or removed in it
changes that), and the walk stops after `MAX_FILES` files, saying so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightdeck.contracts import attempt_event

CODE = "H009"
MAX_FILES = 20_000
MAX_ENTRIES_PER_DIR = 2_000
NAMED = 5
FIX = (
    "write what the run produces under its own directory: a relative path, or '{output_dir}' / "
    "'{run_dir}' in entrypoint.args ($FLIGHTDECK_RUN_DIR in the script); name an earlier run's files "
    "by path only to resume on purpose"
)
_SKIPPED_NAMES = {"__pycache__"}


@dataclass
class WorkspaceListing:
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # relative path -> (size, mtime_ns)
    complete: bool = True


def list_workspace(workspace: Path, skip: list[Path]) -> WorkspaceListing:
    listing = WorkspaceListing()
    skipped = {os.path.realpath(p) for p in skip}
    stack = [workspace]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        if len(entries) > MAX_ENTRIES_PER_DIR and folder != workspace:
            stat = folder.stat()
            listing.files[str(folder.relative_to(workspace)) + "/"] = (len(entries), stat.st_mtime_ns)
            continue
        for entry in entries:
            if entry.name.startswith(".") or entry.name in _SKIPPED_NAMES:
                continue
            path = Path(entry.path)
            try:
                if entry.is_dir(follow_symlinks=False):
                    if os.path.realpath(path) not in skipped:
                        stack.append(path)
                    continue
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if len(listing.files) >= MAX_FILES:
                listing.complete = False
                return listing
            listing.files[str(path.relative_to(workspace))] = (stat.st_size, stat.st_mtime_ns)
    return listing


def written(before: WorkspaceListing, after: WorkspaceListing) -> list[str]:
    """Paths new or changed (size or mtime) in `after`, sorted."""
    return sorted(path for path, seen in after.files.items() if before.files.get(path) != seen)


class WorkspaceWatch:
    """Lists the workspace at launch; `events()` after the run: one H009 warning, or none."""

    def __init__(self, workspace: Path, run_dir: Path, runs_dir: Path | None):
        self.workspace = workspace
        self.skip = [run_dir, *([runs_dir] if runs_dir is not None else [])]
        self.before = list_workspace(workspace, self.skip)

    def events(self) -> list[dict[str, Any]]:
        after = list_workspace(self.workspace, self.skip)
        paths = written(self.before, after)
        if not paths:
            return []
        shown = ", ".join(paths[:NAMED]) + (f" and {len(paths) - NAMED} more" if len(paths) > NAMED else "")
        partial = (
            "" if self.before.complete and after.complete else f" (the first {MAX_FILES} files compared)"
        )
        message = (
            f"the run wrote {len(paths)} file(s) in the workspace outside its run directory{partial}: {shown}; "
            "another run of the script will see them"
        )
        return [
            attempt_event(
                "run:workspace-writes",
                "health",
                message,
                code=CODE,
                severity="warn",
                fix=FIX,
                data={"paths": paths[:50]},
            )
        ]
