"""`entrypoint.requirements`: a script job's own environment over the worker's, the worker's torch kept.

No network: the packages are wheels written into the test's directory the way a build backend
writes them (PEP 427: the module, METADATA, WHEEL, RECORD with hashes) and installed with
`--no-index --find-links`, as a team with a local wheelhouse would.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from flightdeck.recipe import RecipeInvalid, parse_recipe
from flightdeck.worker.agent.job_environment import RequirementsFailed, environment_digest, job_environment
from flightdeck.worker.agent.requirements_includes import included_files
from flightdeck.worker.host_preflight.requirements import requirements_findings

WORKER_TORCH = metadata.version("torch")


def write_wheel(folder: Path, name: str, version: str, requires: list[str] | None = None) -> Path:
    """A pure-Python wheel of one module `name` whose VERSION is `version`."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires or []
    )
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": meta,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: flightdeck-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def _requirements(workspace: Path, *lines: str) -> Path:
    file = workspace / "job" / "requirements.txt"
    file.parent.mkdir(parents=True, exist_ok=True)
    # find-links relative to the requirements file, as pip reads it
    file.write_text("--no-index\n--find-links ../wheels\n" + "".join(f"{line}\n" for line in lines))
    return file


def _where(python: Path, module: str) -> str:
    """Where `python` finds `module` (without importing it: torch takes seconds)."""
    code = f"import importlib.util as u; s = u.find_spec({module!r}); print(s.origin if s else 'absent')"
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_package_the_worker_lacks_is_installed_once_and_the_worker_torch_is_the_jobs(
    tmp_path: Path,
) -> None:
    write_wheel(tmp_path / "wheels", "fdprobe", "0.1")
    file = _requirements(tmp_path, "fdprobe==0.1")
    log = tmp_path / "output.log"
    assert _where(Path(sys.executable), "fdprobe") == "absent"  # the worker's own environment lacks it

    started = time.monotonic()
    env = job_environment(file, tmp_path / "envs", log, cwd=tmp_path)
    built = time.monotonic() - started
    assert not env.reused
    assert _where(env.python, "fdprobe").startswith(str(tmp_path / "envs" / env.digest))
    torch_origin = _where(env.python, "torch")
    assert torch_origin == _where(Path(sys.executable), "torch"), torch_origin  # the worker's torch
    assert "Successfully installed fdprobe-0.1" in log.read_text()  # pip's output is the job's log
    assert _where(Path(sys.executable), "fdprobe") == "absent"  # nothing went into the worker's

    second = tmp_path / "second.log"
    started = time.monotonic()
    again = job_environment(file, tmp_path / "envs", second, cwd=tmp_path)
    reused = time.monotonic() - started
    assert again.reused and again.digest == env.digest and again.python == env.python
    assert "reused" in second.read_text()
    print(f"job environment: built in {built:.2f} s, reused in {reused:.3f} s")
    assert reused < built / 5

    file.write_text(file.read_text() + "# another line\n")  # another file: another environment
    assert job_environment(file, tmp_path / "envs", second, cwd=tmp_path).digest != env.digest


def test_files_included_with_r_and_c_are_part_of_the_environments_digest(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "common").mkdir(parents=True)
    top = job / "requirements.txt"
    top.write_text("-r common/base.txt\n--constraint=pins.txt\nrequests>=2\n")
    base = job / "common" / "base.txt"
    # Relative to base.txt, as pip resolves a nested file; and back to the top file (pip stops a loop too).
    base.write_text("attrs\n-r ../shared.txt  # shared by every job\n--requirement ../requirements.txt\n")
    shared, pins, unrelated = job / "shared.txt", job / "pins.txt", job / "notes.txt"
    shared.write_text("idna\n")
    pins.write_text("idna==3.7\n")
    unrelated.write_text("not included\n")
    assert included_files(top) == [top, base, shared, pins]

    digest = environment_digest(top)
    for included, text in ((shared, "idna\ncertifi\n"), (pins, "idna==3.6\n"), (base, "attrs==23.2\n")):
        included.write_text(text)  # an edit to an included file is another environment
        assert environment_digest(top) != digest, included
        digest = environment_digest(top)
    unrelated.write_text("edited\n")
    assert environment_digest(top) == digest


def test_a_requirement_pip_cannot_resolve_fails_with_pips_reason_and_leaves_no_environment(
    tmp_path: Path,
) -> None:
    file = _requirements(tmp_path, "fdprobe-nowhere==3.1")
    with pytest.raises(RequirementsFailed) as failed:
        job_environment(file, tmp_path / "envs", tmp_path / "output.log", cwd=tmp_path)
    assert "fdprobe-nowhere" in failed.value.reason and failed.value.reason.startswith("ERROR:")
    assert [p.name for p in (tmp_path / "envs").iterdir() if p.is_dir()] == []


def test_a_dependency_asking_for_another_torch_cannot_replace_the_workers(tmp_path: Path) -> None:
    # A wheelhouse that holds a 'torch' 1.0 and a package that requires it: without the constraint,
    # pip would install that torch into the job's environment, shadowing the worker's CUDA build.
    write_wheel(tmp_path / "wheels", "torch", "1.0")
    write_wheel(tmp_path / "wheels", "fdoldtorch", "0.1", requires=["torch==1.0"])
    file = _requirements(tmp_path, "fdoldtorch==0.1")
    with pytest.raises(RequirementsFailed) as failed:
        job_environment(file, tmp_path / "envs", tmp_path / "output.log", cwd=tmp_path)
    assert "torch" in failed.value.reason


def _script_job(requirements: str) -> object:
    return parse_recipe(
        {
            "name": "own-env",
            "entrypoint": {"script": "job/train.py", "requirements": requirements},
            "resources": {"gpus_per_node": 1, "accelerator": "cpu"},
        }
    )


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        ("torch==1.13.1", True),
        ("torch<2", True),
        ("torch @ https://download.pytorch.org/whl/cu118/torch-2.0.0-cp311-linux_x86_64.whl", True),
        ("torch", False),
        (f"torch>={WORKER_TORCH.split('+')[0]}", False),
        ("torch==1.13.1; python_version < '3'", False),  # a marker this worker does not meet
        ("numpy<3", False),
    ],
)
def test_a_torch_pin_the_workers_torch_does_not_satisfy_is_e009_before_anything_is_built(
    tmp_path: Path, line: str, refused: bool
) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "base.txt").write_text(f"{line}  # pinned by the team\n")
    (tmp_path / "job" / "requirements.txt").write_text("transformers\n-r base.txt\n")  # nested, as teams do
    findings = requirements_findings(_script_job("job/requirements.txt"), tmp_path)  # type: ignore[arg-type]
    assert [f.code for f in findings] == (["E009"] if refused else [])  # type: ignore[union-attr]
    if refused:
        message = findings[0].message  # type: ignore[union-attr]
        assert "base.txt:1" in message and WORKER_TORCH in message


def test_a_missing_requirements_file_is_a_host_error_naming_the_files_there(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "requirement.txt").write_text("numpy\n")
    [finding] = requirements_findings(_script_job("job/requirements.txt"), tmp_path)  # type: ignore[arg-type]
    assert finding.path == "entrypoint.requirements"  # type: ignore[union-attr]
    assert "requirement.txt" in finding.message  # type: ignore[union-attr]


def test_a_requirements_path_leaving_the_workspace_is_refused_at_submit() -> None:
    with pytest.raises(RecipeInvalid) as refused:
        _script_job("../other/requirements.txt")
    assert [f.path for f in refused.value.findings] == ["entrypoint.requirements"]


@pytest.mark.slow
def test_script_jobs_with_a_requirements_file_through_a_real_service_and_agent(
    cluster: Any, tiny_workspace: Path
) -> None:
    """A script that imports a package the worker lacks succeeds; the second job reuses the environment;
    an unresolvable file is E008 and a torch pin E009, both before launch, with pip's output in the log.
    The script also writes a file in the workspace by path: H009 names it."""
    from .processes import Agent, Service
    from .test_end_to_end import _log_text, _submit, _wait_status, _why

    team = tiny_workspace / "team-env"
    write_wheel(team / "wheels", "fdprobe", "0.2")
    (team / "job").mkdir(parents=True, exist_ok=True)
    (team / "job" / "train.py").write_text(
        "import os\nimport fdprobe\n\nprint(f'fdprobe {fdprobe.VERSION} from {fdprobe.__file__}')\n"
        # by path, outside its run directory: H009
        "open(os.path.join(os.environ['FLIGHTDECK_WORKSPACE'], 'team-env', 'notes.txt'), 'w').write('ran')\n"
    )
    (team / "job" / "requirements.txt").write_text("--no-index\n--find-links ../wheels\nfdprobe==0.2\n")
    (team / "job" / "broken.txt").write_text("--no-index\n--find-links ../wheels\nfdprobe==9.9\n")
    (team / "job" / "torch-pin.txt").write_text(
        "--no-index\n--find-links ../wheels\ntorch==1.13.1\nfdprobe\n"
    )
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "env")
    api = service.api()

    def run(requirements: str) -> dict[str, Any]:
        recipe = {
            "name": "own-env",
            "entrypoint": {"script": "team-env/job/train.py", "requirements": f"team-env/job/{requirements}"},
            "resources": {"gpus_per_node": 1, "accelerator": "cpu"},
        }
        job_id = _submit(api, recipe, max_attempts=1)
        return _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 180)

    def environment_event(job: dict[str, Any]) -> dict[str, Any]:
        events = api.get(f"/jobs/{job['id']}/events", params={"limit": 1000}).json()
        events = events["events"] if isinstance(events, dict) else events
        [event] = [e for e in events if e["kind"] == "launch" and "digest" in e["data"]]
        return event  # type: ignore[no-any-return]

    first = run("requirements.txt")
    assert first["status"] == "succeeded", (_why(api, first), agent.log()[-2000:])
    log = _log_text(api, first["id"])
    assert "Successfully installed fdprobe-0.2" in log  # the build's output is the job's log
    assert "fdprobe 0.2 from " + str(agent.runs_dir / ".envs") in log
    assert environment_event(first)["data"]["reused"] is False
    events = api.get(f"/jobs/{first['id']}/events", params={"limit": 1000}).json()
    events = events["events"] if isinstance(events, dict) else events
    [h009] = [e for e in events if e["code"] == "H009"]
    assert h009["severity"] == "warn" and h009["data"]["paths"] == ["team-env/notes.txt"]

    second = run("requirements.txt")
    assert second["status"] == "succeeded", _why(api, second)
    built, reused = environment_event(first)["data"], environment_event(second)["data"]
    assert reused["reused"] is True and reused["digest"] == built["digest"]
    print(f"job environment through the agent: built in {built['seconds']} s, then reused")

    broken = run("broken.txt")
    assert (broken["status"], broken["failure_class"], broken["failure_code"]) == (
        "failed",
        "preflight",
        "E008",
    )
    assert "fdprobe==9.9" in broken["failure_message"]
    assert "No matching distribution found for fdprobe==9.9" in _log_text(api, broken["id"])

    pinned = run("torch-pin.txt")
    assert (pinned["status"], pinned["failure_class"], pinned["failure_code"]) == (
        "failed",
        "preflight",
        "E009",
    )
    assert "torch-pin.txt:3" in pinned["failure_message"]
    assert len(agent.torchrun_pids()) == 2  # neither failed job was launched


def test_a_requirements_file_linked_from_outside_the_workspace_is_s001(tmp_path: Path) -> None:
    from flightdeck.worker.path_confinement import confinement_findings

    workspace, outside = tmp_path / "workspace", tmp_path / "elsewhere"
    (workspace / "job").mkdir(parents=True)
    outside.mkdir()
    (workspace / "job" / "train.py").write_text("print('hi')\n")
    (outside / "requirements.txt").write_text("numpy\n")
    (workspace / "job" / "requirements.txt").symlink_to(outside / "requirements.txt")
    findings = confinement_findings(_script_job("job/requirements.txt"), workspace)  # type: ignore[arg-type]
    assert [(f.code, f.path) for f in findings] == [("S001", "entrypoint.requirements")]
