"""Host check: path confinement (S001) runs first, and a path outside the roots is never opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.inventory import WorkerInventory
from worker.agent.host_check import run_host_check


def test_a_path_outside_the_roots_is_refused_before_any_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    secret = outside / "secret.jsonl"
    secret.write_text('{"password_field": "hunter2"}\n')
    workspace = tmp_path / "ws"
    workspace.mkdir()

    def must_not_run(*_: object, **__: object) -> None:
        raise AssertionError("host preflight read files of a recipe that is not confined")

    monkeypatch.setattr("worker.agent.host_check.run_host_preflight", must_not_run)
    recipe = {
        "name": "confined",
        "model": {"path": "m"},
        "data": {"train": [{"path": str(secret)}]},
        "resources": {"accelerator": "cpu"},
    }
    inventory = WorkerInventory(
        cpu_slots=1, cores=1, workspace=str(workspace), runs_dir=str(workspace / "runs")
    )
    check = run_host_check(recipe, inventory, [0])
    assert [f["code"] for f in check.errors] == ["S001"]
    text = str(check.events())
    assert "hunter2" not in text and "password_field" not in text
