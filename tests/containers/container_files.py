"""Readers for the container files: compose.yaml with Compose's interpolation, Dockerfiles, .env files."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
COMPOSE_GUIDE = ROOT / "docs" / "compose.md"
DOCKERFILES = {
    "service": ROOT / "docker" / "service.Dockerfile",
    "worker": ROOT / "docker" / "worker.Dockerfile",
}
SCHEMA_FILE = Path(__file__).resolve().parent / "compose-spec.json"

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, ${NAME:+alt}, ${NAME+alt}
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^{}]*))?\}")
_ESCAPED_DOLLAR = "\0"


class MissingVariable(LookupError):
    """A `${NAME:?message}` reference whose variable is unset or empty."""


def variables_in(text: str) -> set[str]:
    """Every variable `text` interpolates ($$ is a literal dollar, not a reference)."""
    return {match.group(1) for match in _REFERENCE.finditer(text.replace("$$", ""))}


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable substitution, for the forms compose.yaml may use (no nesting)."""

    def substitute(match: re.Match[str]) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3) or ""
        is_set = name in env
        value = env.get(name, "")
        if operator is None:
            return value
        if operator in (":?", "?"):
            if not is_set or (operator == ":?" and not value):
                raise MissingVariable(f"{name}: {argument}")
            return value
        # Colon forms treat an empty value as unset.
        present = bool(value) if operator.startswith(":") else is_set
        if operator.endswith("-"):
            return value if present else argument
        return argument if present else ""

    escaped = text.replace("$$", _ESCAPED_DOLLAR)
    result = _REFERENCE.sub(substitute, escaped)
    if "${" in result:
        raise ValueError(f"unsupported interpolation left in {result!r}")
    return result.replace(_ESCAPED_DOLLAR, "$")


def load_compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml as a dict; with `env`, after Compose's interpolation (YAML anchors merged)."""
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("compose.yaml is not a mapping")
    return data if env is None else _interpolate_tree(data, env)


def _interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_tree(value, env) for key, value in node.items()}
    return node


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines of a Compose .env file (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, sep, value = stripped.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"{path.name}:{number}: not KEY=value: {line!r}")
        values[name] = value
    return values


def environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's `environment`, as a dict whichever of the two forms it uses."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def enabled_services(compose: Mapping[str, Any], profiles: set[str]) -> dict[str, Any]:
    """The services `docker compose --profile ... up` creates: those with no profile or an active one."""
    return {
        name: service
        for name, service in compose["services"].items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }


def dependencies_of(service: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A service's `depends_on` as {name: options}, whichever of the two forms it uses."""
    depends_on = service.get("depends_on") or {}
    if isinstance(depends_on, list):
        return {name: {"condition": "service_started"} for name in depends_on}
    return {name: dict(options or {}) for name, options in depends_on.items()}


def unmet_dependencies(compose: Mapping[str, Any], profiles: set[str]) -> list[str]:
    """Required dependencies on services the profiles leave out: Compose refuses to start such a project."""
    enabled = enabled_services(compose, profiles)
    return [
        f"{name} -> {dependency}"
        for name, service in enabled.items()
        for dependency, options in dependencies_of(service).items()
        if dependency not in enabled and options.get("required", True)
    ]


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool


def mounts_of(service: Mapping[str, Any]) -> list[Mount]:
    """A service's volumes in short (`source:target[:ro]`) or long syntax."""
    mounts = []
    for item in service.get("volumes") or []:
        if isinstance(item, str):
            parts = item.split(":")
            mode = parts[2] if len(parts) > 2 else ""
            mounts.append(Mount(parts[0], parts[1], "ro" in mode.split(",")))
        else:
            mounts.append(Mount(item.get("source", ""), item["target"], bool(item.get("read_only"))))
    return mounts


def is_named_volume(source: str) -> bool:
    """Compose treats a short-syntax source that is not a path as a named volume."""
    return bool(source) and not source.startswith(("/", ".", "~"))


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int


def dockerfile_instructions(path: Path) -> list[Instruction]:
    """Instructions with their continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        joined = " ".join(part for part in pending if part)
        keyword, _, arguments = joined.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
        pending = []
    return instructions


def dockerfile_env(instructions: list[Instruction]) -> dict[str, str]:
    """Variables set by ENV (the `KEY=value ...` form)."""
    env: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "ENV":
            for word in shlex.split(instruction.arguments):
                name, _, value = word.partition("=")
                env[name] = value
    return env


def flightdeck_invocations(argv: list[str]) -> Iterator[list[str]]:
    """The `flightdeck ...` command lines a container runs: argv itself, or lines of an `sh -c` script."""
    if argv and argv[0] == "flightdeck":
        yield argv
        return
    if len(argv) >= 3 and argv[0] in ("/bin/sh", "sh", "/bin/bash", "bash") and argv[1] == "-c":
        for line in argv[2].splitlines():
            for segment in re.split(r"\|\||&&|;", line):
                words = shlex.split(segment)
                if words and words[0] == "flightdeck":
                    yield words


# Which image each compose service runs (the others run the worker image).
IMAGE_OF_SERVICE = {"service": "service", "demo-job": "service"}


def container_argv(
    service_name: str, service: Mapping[str, Any], dockerfiles: Mapping[str, list[Instruction]]
) -> list[str]:
    """What the container executes: compose's entrypoint/command over the image's ENTRYPOINT/CMD."""
    instructions = dockerfiles[IMAGE_OF_SERVICE.get(service_name, "worker")]

    def image_default(keyword: str) -> list[str]:
        return json.loads([i for i in instructions if i.keyword == keyword][-1].arguments)  # type: ignore[no-any-return]

    entrypoint = service.get("entrypoint") or image_default("ENTRYPOINT")
    command = service.get("command")
    if command is None:
        command = image_default("CMD")
    return [*entrypoint, *([command] if isinstance(command, str) else command)]


def built_here(service: Mapping[str, Any]) -> bool:
    """Whether a service runs one of this repository's images, not a third-party one such as postgres."""
    return "build" in service


def flightdeck_invocations_of(
    services: Mapping[str, Mapping[str, Any]], dockerfiles: Mapping[str, list[Instruction]]
) -> dict[str, list[list[str]]]:
    """{compose service built here: the `flightdeck ...` command lines its container runs}."""
    return {
        name: list(flightdeck_invocations(container_argv(name, service, dockerfiles)))
        for name, service in services.items()
        if built_here(service)
    }


def secret_like_strings(text: str) -> list[str]:
    """Substrings that look like a credential: long runs mixing letters and digits, or known prefixes."""
    found = []
    for match in re.finditer(r"[A-Za-z0-9_+-]{24,}", text):
        word = match.group()
        if re.fullmatch(r"[A-Z0-9_]+", word):  # an environment variable's name
            continue
        if re.search(r"[0-9]", word) and re.search(r"[A-Za-z]", word):
            found.append(word)
    found += re.findall(r"\b(?:hf_|ghp_|gho_|github_pat_|sk-|xox[bp]-|AKIA)[A-Za-z0-9_-]{8,}", text)
    return found
