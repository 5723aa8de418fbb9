"""Host check: path confinement (S001) runs first, and a path outside the roots is never opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightdeck.inventory import WorkerInventory
from flightdeck.worker.agent.host_check import run_host_check


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

    monkeypatch.setattr("flightdeck.worker.agent.host_check.run_host_preflight", must_not_run)
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
    assert "relative to the workspace" in str(check.errors[0]["fix"])
    text = str(check.events())
    assert "hunter2" not in text and "password_field" not in text


def _script_check(
    workspace: Path, entrypoint: dict[str, object], **inventory: object
) -> list[dict[str, object]]:
    recipe = {"name": "own", "entrypoint": entrypoint, "resources": {"accelerator": "cpu"}}
    worker = WorkerInventory(
        cpu_slots=1, cores=1, workspace=str(workspace), runs_dir=str(workspace / "runs"), **inventory
    )
    return run_host_check(recipe, worker, [0]).errors


def test_a_script_jobs_program_must_exist_compile_and_stay_in_the_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "team").mkdir(parents=True)
    (workspace / "team" / "train.py").write_text("print('ok')\n")
    (workspace / "team" / "broken.py").write_text("def f(:\n")
    (tmp_path / "outside.py").write_text("print('outside')\n")
    (workspace / "team" / "link.py").symlink_to(tmp_path / "outside.py")
    assert _script_check(workspace, {"script": "team/train.py"}) == []
    assert _script_check(workspace, {"module": "team.train"}) == []
    missing = _script_check(workspace, {"script": "team/trian.py"})
    assert missing[0]["path"] == "entrypoint.script" and "train.py" in str(missing[0]["message"])
    assert "entrypoint.script" in str(missing[0]["fix"])
    (broken,) = _script_check(workspace, {"script": "team/broken.py"})
    assert "does not compile" in str(broken["message"]) and "line 1" in str(broken["fix"])
    assert [f["code"] for f in _script_check(workspace, {"script": "team/link.py"})] == ["S001"]
    assert [f["code"] for f in _script_check(workspace, {"module": "team.link"})] == ["S001"]
    # An installed module (not a file of the workspace) is not a script job's program.
    assert _script_check(workspace, {"module": "http.server"})[0]["path"] == "entrypoint.module"


def test_a_no_scripts_worker_refuses_a_script_job_it_was_given(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('ok')\n")
    refused = _script_check(tmp_path, {"script": "train.py"}, runs_scripts=False)
    assert refused[0]["path"] == "entrypoint" and "--no-scripts" in str(refused[0]["message"])
