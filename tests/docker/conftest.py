"""Fixtures: a private Docker engine, the base images the Dockerfiles pull, and the project's two images.

Everything here needs root and scripts/install-docker.sh; the tests run only with `-m docker` (CI runs
them). Set FLIGHTDECK_TEST_DOCKER_DATA_ROOT to a directory to keep the engine's image layers between
runs (a second run then rebuilds only what changed); by default the engine starts empty, as in CI.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker import base_images
from tests.docker.compose_project import ROOT, ComposeProject, env_file_text
from tests.docker.engine import DockerEngine, missing_tools, running_engine

TORCH_BASE_ARG = "BASE_IMAGE"


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    if os.geteuid() != 0:
        pytest.fail("the docker tests start their own dockerd in a network namespace: run them as root")
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        # Each worker would start its own engine and build both images again, on the same CPUs.
        pytest.fail(
            "the docker tests share one engine and its images: run them in one process "
            "(FLIGHTDECK_TEST_WORKERS=0 scripts/test.sh -m docker)"
        )
    missing = missing_tools()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run scripts/install-docker.sh (as root)")
    data_root = os.environ.get("FLIGHTDECK_TEST_DOCKER_DATA_ROOT")
    with running_engine(Path(data_root) if data_root else None) as engine:
        yield engine


@pytest.fixture(scope="session")
def build_seconds() -> Iterator[dict[str, float]]:
    """How long each image took, printed at the end of the session (-s) for docs/compose.md."""
    timings: dict[str, float] = {}
    yield timings
    print("\nimage build seconds:", {name: round(seconds, 1) for name, seconds in timings.items()})


@pytest.fixture(scope="session")
def project_images(
    docker_engine: DockerEngine, build_seconds: dict[str, float], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Base stand-ins, then both images built by `docker compose build` from the project's Dockerfiles."""
    started = time.monotonic()
    python_base = base_images.from_image(ROOT / "docker" / "service.Dockerfile")
    base_images.build_python_base(docker_engine, python_base)
    build_seconds["python base (debootstrap cached or made)"] = time.monotonic() - started

    started = time.monotonic()
    torch_base = base_images.build_torch_base(docker_engine, python_base)
    build_seconds["torch cpu base"] = time.monotonic() - started

    env_file = tmp_path_factory.mktemp("build") / ".env"
    env_file.write_text(env_file_text())
    project = ComposeProject(docker_engine, env_file, ["cpu"])
    started = time.monotonic()
    project.compose("build", "--build-arg", f"{TORCH_BASE_ARG}={torch_base}", timeout=1200).check()
    build_seconds["compose build (service, worker)"] = time.monotonic() - started
    return {"python_base": python_base, "torch_base": torch_base}


@pytest.fixture(scope="module")
def compose_env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_file = tmp_path_factory.mktemp("compose") / ".env"
    env_file.write_text(env_file_text())
    return env_file


def tear_down(project: ComposeProject) -> None:
    """Every container and volume of the project, whatever state a failed test left them in."""
    every_profile = ["cpu", "gpu", "postgres"]
    project.compose(
        "down", "--volumes", "--remove-orphans", "--timeout", "5", profiles=every_profile, timeout=180
    )
