"""H009: what a script job writes in the workspace outside its run directory is named, cheaply."""

from __future__ import annotations

import os
from pathlib import Path

from flightdeck.worker.agent import workspace_writes
from flightdeck.worker.agent.workspace_writes import WorkspaceWatch


def _workspace(tmp_path: Path) -> tuple[Path, Path]:
    workspace = tmp_path / "workspace"
    (workspace / "models" / "tiny").mkdir(parents=True)
    (workspace / "models" / "tiny" / "config.json").write_text("{}")
    (workspace / "scripts").mkdir()
    (workspace / "scripts" / "train.py").write_text("print('hi')\n")
    run_dir = workspace / "runs" / "20261127-0a1b2c3d" / "job-1-attempt-1"  # <runs>/<database>/job-...
    run_dir.mkdir(parents=True)
    return workspace, run_dir


def test_new_and_changed_files_outside_the_run_directory_are_named_and_nothing_else(tmp_path: Path) -> None:
    workspace, run_dir = _workspace(tmp_path)
    watch = WorkspaceWatch(workspace, run_dir, workspace / "runs")
    assert watch.events() == []  # nothing written: no warning

    (run_dir / "checkpoint.pt").write_bytes(b"x")  # its own directory
    (workspace / "runs" / "20261127-0a1b2c3d" / "job-2-attempt-1").mkdir()  # another run's
    (workspace / "runs" / "20261101-ffffffff" / "job-1-attempt-1").mkdir(parents=True)  # another database's
    (workspace / "scripts" / "__pycache__").mkdir()  # Python's bytecode for the script's imports
    (workspace / "scripts" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"x")
    (workspace / ".cache").mkdir()
    assert watch.events() == []

    (workspace / "scripts" / "snapshot.pt").write_bytes(b"weights")  # pytorch/examples' resume file
    config = workspace / "models" / "tiny" / "config.json"
    config.write_text('{"changed": true}')
    [event] = watch.events()
    assert (event["code"], event["severity"]) == ("H009", "warn")
    assert event["data"]["paths"] == ["models/tiny/config.json", "scripts/snapshot.pt"]
    assert "scripts/snapshot.pt" in event["message"] and "{output_dir}" in event["fix"]


def test_big_trees_are_one_entry_and_the_walk_is_bounded(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    workspace, run_dir = _workspace(tmp_path)
    shards = workspace / "data" / "shards"
    shards.mkdir(parents=True)
    for i in range(30):
        (shards / f"part-{i:05d}.arrow").write_bytes(b"x")
    monkeypatch.setattr(workspace_writes, "MAX_ENTRIES_PER_DIR", 20)
    watch = WorkspaceWatch(workspace, run_dir, None)
    assert "data/shards/" in watch.before.files and not any("part-" in p for p in watch.before.files)
    (shards / "part-99999.arrow").write_bytes(b"x")  # a file added in it changes the folder's mtime
    os.utime(shards, ns=(1, 1))  # made certain however coarse the file system's clock
    [event] = watch.events()
    assert event["data"]["paths"] == ["data/shards/"]

    monkeypatch.setattr(workspace_writes, "MAX_FILES", 2)
    assert not WorkspaceWatch(workspace, run_dir, None).before.complete
