"""A script job runs only the team's own code: programs that turn a job's args into a shell (torchrun,
pip, anything in a virtualenv or in site-packages), output a run wrote, and the service's data are
refused wherever they sit (S001), through a real service and a real agent.

The attack this guards against: with the repository as the workspace, `.venv/bin/torchrun` as the
script and `--no-python /bin/sh -c ...` as its args ran a root shell and printed the service's tokens.
"""

from __future__ import annotations

import json.tool as json_tool
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.run

from flightdeck.contracts import SERVICE_DATA_MARKER
from flightdeck.worker.path_confinement import confinement_findings

from .processes import Agent, Service, free_tcp_port, kill_strays
from .test_end_to_end import _submit, _wait_status

TORCHRUN_SOURCE = Path(torch.distributed.run.__file__)


def _shell_args(marker: Path) -> list[str]:
    return ["--standalone", "--nproc_per_node", "1", "--no-python", "/bin/sh", "-c", f"id > {marker}"]


def _job(entrypoint: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "gadget",
        "entrypoint": entrypoint,
        "resources": {"accelerator": "cpu", "gpus_per_node": 1},
    }


@pytest.fixture
def readme_layout(tmp_path: Path) -> dict[str, Path]:
    """A workspace laid out as the old README had it: a virtualenv, the service's data, runs inside."""
    workspace = tmp_path / "repo"
    (workspace / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.executable).with_name("torchrun"), workspace / ".venv" / "bin" / "torchrun")
    shutil.copy(TORCHRUN_SOURCE, workspace / ".venv" / "bin" / "torchrun.py")
    (workspace / "tools").mkdir()
    os.symlink(TORCHRUN_SOURCE, workspace / "tools" / "launch.py")  # a link into site-packages
    (workspace / "mods").mkdir()
    os.symlink(TORCHRUN_SOURCE, workspace / "mods" / "launch.py")
    (workspace / "runs" / "job-1").mkdir(parents=True)
    shutil.copy(TORCHRUN_SOURCE, workspace / "runs" / "job-1" / "left_behind.py")
    (workspace / "train.py").write_text("print('the team script')\n")
    return {"workspace": workspace, "data": workspace / "flightdeck-data", "runs": workspace / "runs"}


@pytest.mark.slow  # a real service and agent: about 20 s
def test_gadget_scripts_are_refused_by_a_real_agent(readme_layout: dict[str, Path], tmp_path: Path) -> None:
    workspace, data_dir = readme_layout["workspace"], readme_layout["data"]
    service = Service(data_dir, free_tcp_port())
    agent = Agent(service, workspace, readme_layout["runs"], "gadget-host", slots=1)
    marker = tmp_path / "PWNED"
    try:
        service.start()
        # The service's own data directory holds a Python file too: nothing makes it code to run.
        (data_dir / "notes.py").write_text("print(1)\n")
        agent.start()
        api = service.api()
        # The attack exactly as reported is refused at submit: torchrun's launcher is no .py file.
        answer = api.post("/jobs", json=_job({"script": ".venv/bin/torchrun", "args": _shell_args(marker)}))
        assert answer.status_code == 422 and "entrypoint.script" in answer.text, answer.text
        refused = {
            ".venv/bin/torchrun.py": "dot-directory",
            "tools/launch.py": "leads outside the worker's allowed roots",
            "runs/job-1/left_behind.py": "runs directory",
            "flightdeck-data/notes.py": "data directory",
        }
        jobs = {
            script: _submit(api, _job({"script": script, "args": _shell_args(marker)})) for script in refused
        }
        jobs["mods.launch"] = _submit(api, _job({"module": "mods.launch", "args": _shell_args(marker)}))
        refused["mods.launch"] = "leads outside the worker's allowed roots"
        # A recipe job naming the service's tokens as data is refused before any row is read.
        secret = {
            "name": "read-tokens",
            "model": {"path": "models/none"},
            "data": {"train": [{"path": "flightdeck-data/tokens.env", "format": "csv", "preset": "alpaca"}]},
            "resources": {"accelerator": "cpu", "gpus_per_node": 1},
        }
        jobs["tokens"] = _submit(api, secret)
        refused["tokens"] = "data directory"
        for what, job_id in jobs.items():
            job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 60)
            assert job["status"] == "failed" and job["failure_code"] == "S001", (what, job)
            assert refused[what] in (job["failure_message"] or ""), (what, job["failure_message"])
            logs = api.get(f"/jobs/{job_id}/logs").text
            assert "test-worker-token" not in logs and "test-user-token" not in logs
        assert not marker.exists()
        assert agent.proc is not None and agent.proc.poll() is None  # the agent itself carries on
    finally:
        agent.stop(timeout=20)
        service.stop()
        kill_strays(str(tmp_path))


def test_the_teams_own_script_passes_and_a_scripts_dir_narrows_it(readme_layout: dict[str, Path]) -> None:
    from flightdeck.recipe import parse_recipe

    workspace = readme_layout["workspace"]
    (workspace / "team").mkdir()
    (workspace / "team" / "train.py").write_text("print('ok')\n")
    own = parse_recipe(_job({"script": "train.py"}))
    assert confinement_findings(own, workspace, runs_dir=readme_layout["runs"]) == []
    narrowed = confinement_findings(own, workspace, runs_dir=readme_layout["runs"], scripts_dir="team")
    assert [f.code for f in narrowed] == ["S001"] and "scripts directory" in narrowed[0].message
    inside = parse_recipe(_job({"script": "team/train.py"}))
    assert confinement_findings(inside, workspace, runs_dir=readme_layout["runs"], scripts_dir="team") == []


def test_a_service_data_directory_is_recognised_by_its_marker_wherever_it_is(tmp_path: Path) -> None:
    from flightdeck.recipe import parse_recipe

    workspace = tmp_path / "ws"
    (workspace / "state" / "db").mkdir(parents=True)
    (workspace / "state" / SERVICE_DATA_MARKER).touch()
    (workspace / "state" / "db" / "run.py").write_text("print(1)\n")
    found = confinement_findings(parse_recipe(_job({"script": "state/db/run.py"})), workspace)
    assert [f.code for f in found] == ["S001"] and "data directory" in found[0].message


def test_programs_of_the_python_environment_are_refused_even_inside_the_workspace() -> None:
    """A workspace that contains the interpreter's own prefix (an odd layout, but any layout): its
    programs are no team's training code."""
    from flightdeck.recipe import parse_recipe

    prefix = Path(sys.base_prefix)
    stdlib_program = Path(json_tool.__file__).resolve().relative_to(prefix.resolve())
    found = confinement_findings(parse_recipe(_job({"script": str(stdlib_program)})), prefix)
    assert [f.code for f in found] == ["S001"] and "Python environment" in found[0].message, found
