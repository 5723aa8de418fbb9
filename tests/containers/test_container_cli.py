"""Every command, flag and FLIGHTDECK_* variable the containers use exists in the real CLI."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.containers.container_files import (
    container_argv,
    dockerfile_env,
    environment_of,
    flightdeck_invocations_of,
)

# Read outside any command's options: by service/core/db.py (checked in test_container_images.py).
READ_BY_MODULES = {"FLIGHTDECK_MIGRATIONS_DIR"}


def _subcommand(invocation: list[str]) -> str:
    return invocation[1]


def _options_in(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text))


def _settings_variables() -> set[str]:
    """Variables flightdeck.service.core.config.Settings reads (prefix + field name, and aliases)."""
    from pydantic import AliasChoices

    from flightdeck.service.core.config import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    names = set()
    for field_name, field in Settings.model_fields.items():
        names.add(f"{prefix}{field_name}".upper())
        if isinstance(field.validation_alias, AliasChoices):
            names.update(str(choice).upper() for choice in field.validation_alias.choices)
    return names


def test_every_container_runs_flightdeck(services: dict[str, Any], dockerfiles: dict[str, Any]) -> None:
    invocations = flightdeck_invocations_of(services, dockerfiles)
    # Only third-party images are left out, and they must not be mistaken for a worker image.
    assert set(services) - set(invocations) == {"postgres"}
    assert "build" not in services["postgres"]
    for name, found in invocations.items():
        assert found, (
            f"{name} runs no flightdeck command: {container_argv(name, services[name], dockerfiles)}"
        )
    assert [_subcommand(i) for i in invocations["service"]] == ["serve"]
    assert [_subcommand(i) for i in invocations["worker"]] == ["worker"]
    assert [_subcommand(i) for i in invocations["worker-cpu"]] == ["worker"]
    assert {_subcommand(i) for i in invocations["demo-assets"]} == {"make-tiny-model", "make-demo-data"}


def test_subcommands_and_flags_exist(
    services: dict[str, Any], dockerfiles: dict[str, Any], cli_help: Callable[..., str]
) -> None:
    commands_panel = cli_help().partition("Commands")[2]
    commands = set(re.findall(r"^\W*([a-z][a-z0-9-]*)\s{2,}\S", commands_panel, re.MULTILINE))
    assert {"serve", "worker"} <= commands, commands
    for name, invocations in flightdeck_invocations_of(services, dockerfiles).items():
        for invocation in invocations:
            subcommand = _subcommand(invocation)
            assert subcommand in commands, f"{name}: `flightdeck {subcommand}` does not exist"
            known = _options_in(cli_help(subcommand))
            used = {word.split("=")[0] for word in invocation[2:] if word.startswith("--")}
            assert used - known == set(), f"{name}: flightdeck {subcommand} has no {sorted(used - known)}"


def test_flightdeck_variables_in_compose_exist(
    services: dict[str, Any], dockerfiles: dict[str, Any], cli_help: Callable[..., str]
) -> None:
    settings = _settings_variables()
    for name, invocations in flightdeck_invocations_of(services, dockerfiles).items():
        helps = " ".join(cli_help(_subcommand(i)) for i in invocations)
        serves = any(_subcommand(i) == "serve" for i in invocations)
        for variable in environment_of(services[name]):
            if not variable.startswith("FLIGHTDECK_"):
                continue
            known = re.search(rf"\b{variable}\b", helps) or (serves and variable in settings)
            assert known, f"{name}: no command it runs reads {variable}"


def test_the_service_reads_the_database_url_compose_passes(services: dict[str, Any]) -> None:
    assert "DATABASE_URL" in environment_of(services["service"])
    assert "DATABASE_URL" in _settings_variables()


@pytest.mark.parametrize(("image", "subcommand"), [("service", "serve"), ("worker", "worker")])
def test_flightdeck_variables_in_images_exist(
    image: str, subcommand: str, dockerfiles: dict[str, Any], cli_help: Callable[..., str]
) -> None:
    settings = _settings_variables() if subcommand == "serve" else set()
    for variable in dockerfile_env(dockerfiles[image]):
        if not variable.startswith("FLIGHTDECK_") or variable in READ_BY_MODULES:
            continue
        known = re.search(rf"\b{variable}\b", cli_help(subcommand)) or variable in settings
        assert known, f"{image} image sets {variable}, which `flightdeck {subcommand}` does not read"


def test_the_checks_see_a_missing_flag(cli_help: Callable[..., str]) -> None:
    worker_help = cli_help("worker")
    assert "--cpu-slots" in _options_in(worker_help)
    assert "--gpu-slots" not in _options_in(worker_help)
    assert "FLIGHTDECK_WORKER_TOKEN" in worker_help
    assert not re.search(r"\bFLIGHTDECK_WORKER\b", worker_help)
