"""Fixtures: compose.yaml raw and interpolated, the Dockerfiles, and `flightdeck ... --help` texts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.containers.container_files import (
    DOCKERFILES,
    ENV_EXAMPLE,
    Instruction,
    dockerfile_instructions,
    load_compose,
    read_env_file,
)

# Stand-ins for the secrets .env.example leaves empty, so `${NAME:?...}` references resolve.
PLACEHOLDER_SECRETS = {
    "FLIGHTDECK_USER_TOKEN": "user-token-placeholder",
    "FLIGHTDECK_WORKER_TOKEN": "worker-token-placeholder",
}


@pytest.fixture(scope="session")
def env_example() -> dict[str, str]:
    return read_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="session")
def compose_env(env_example: dict[str, str]) -> dict[str, str]:
    """What a user's .env holds after following .env.example."""
    return {**env_example, **PLACEHOLDER_SECRETS}


@pytest.fixture(scope="session")
def compose_raw() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="session")
def compose(compose_env: dict[str, str]) -> dict[str, Any]:
    return load_compose(compose_env)


@pytest.fixture(scope="session")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def dockerfiles() -> dict[str, list[Instruction]]:
    return {name: dockerfile_instructions(path) for name, path in DOCKERFILES.items()}


def _flightdeck_executable() -> str:
    beside_python = Path(sys.executable).with_name("flightdeck")
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("flightdeck")
    if found is None:
        pytest.fail("the `flightdeck` command is not installed (pip install -e '.[service,worker,dev]')")
    return found


@pytest.fixture(scope="session")
def cli_help() -> Callable[..., str]:
    """`flightdeck <words> --help` output, run as a user would run it, cached per command."""
    cache: dict[tuple[str, ...], str] = {}
    executable = _flightdeck_executable()
    # Wide and plain, so no option or variable name is wrapped or coloured.
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "PYTHONIOENCODING": "utf-8"}

    def help_text(*words: str) -> str:
        if words not in cache:
            result = subprocess.run(
                [executable, *words, "--help"], capture_output=True, text=True, env=env, timeout=60
            )
            assert result.returncode == 0, f"flightdeck {' '.join(words)} --help failed:\n{result.stderr}"
            cache[words] = result.stdout
        return cache[words]

    return help_text
