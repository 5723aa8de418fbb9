"""compose.yaml: valid Compose, GPU reservation, health-gated start, volumes where recipes look, no secrets."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import secrets
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest

from tests.containers.container_files import (
    COMPOSE_FILE,
    COMPOSE_GUIDE,
    DOCKERFILES,
    ENV_EXAMPLE,
    ROOT,
    SCHEMA_FILE,
    MissingVariable,
    dependencies_of,
    enabled_services,
    environment_of,
    interpolate,
    is_named_volume,
    load_compose,
    mounts_of,
    secret_like_strings,
    unmet_dependencies,
    variables_in,
)

WORKSPACE = PurePosixPath("/workspace")
WORKER_SERVICES = ("worker", "worker-cpu")
EXAMPLES = sorted((ROOT / "examples").glob("*.json"))
DEMO_RECIPE = ROOT / "examples" / "tiny-demo.json"


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _errors(document: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(document)]


def test_compose_validates_against_the_compose_specification(
    compose_raw: dict[str, Any], compose: dict[str, Any]
) -> None:
    assert _errors(compose_raw) == []
    # Compose validates again after interpolation; .env.example's values must keep it valid.
    assert _errors(compose) == []


def test_the_vendored_schema_rejects_what_compose_rejects(compose_raw: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose_raw)
    broken["services"]["worker"]["shm_sise"] = "16gb"
    broken["services"]["service"]["depends_on"] = {"worker": {"condition": "service_ready"}}
    broken["services"]["worker-cpu"]["depends_on"]["service"]["required"] = "no"
    errors = _errors(broken)
    assert any("shm_sise" in e for e in errors), errors
    assert len(errors) >= 3


def test_gpu_worker_reserves_nvidia_gpus(services: dict[str, Any], env_example: dict[str, str]) -> None:
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    gpu = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
    assert gpu, devices
    assert str(gpu[0].get("count", "all")) == "all" or int(gpu[0]["count"]) >= 1
    # `docker compose up` with .env from .env.example starts the GPU worker.
    assert "gpu" in services["worker"]["profiles"]
    assert "gpu" in env_example["COMPOSE_PROFILES"].split(",")


def test_cpu_profile_runs_without_any_gpu(services: dict[str, Any]) -> None:
    cpu = {name: s for name, s in services.items() if "cpu" in s.get("profiles", [])}
    assert {"worker-cpu", "demo-assets", "demo-job"} <= set(cpu)
    for name, service in {**cpu, "service": services["service"]}.items():
        assert "deploy" not in service and "gpus" not in service, f"{name} asks for GPUs"
    # The GPU worker must not start with --profile cpu, where no GPU runtime may exist.
    assert "cpu" not in services["worker"]["profiles"]
    assert "--cpu-slots" in services["worker-cpu"]["command"]


def test_service_has_a_fast_health_check_on_healthz(services: dict[str, Any]) -> None:
    check = services["service"]["healthcheck"]
    assert check["test"][0] == "CMD" and "/healthz" in " ".join(check["test"])
    assert _seconds(check["interval"]) <= 10
    assert _seconds(check["timeout"]) < _seconds(check["interval"])
    published = [p.split(":") for p in services["service"]["ports"]]
    assert ["8000", "8000"] in published


def test_every_client_of_the_service_waits_until_it_is_healthy(services: dict[str, Any]) -> None:
    for name in ("worker", "worker-cpu", "demo-job"):
        assert services[name]["depends_on"]["service"]["condition"] == "service_healthy", name
    assert (
        services["worker-cpu"]["depends_on"]["demo-assets"]["condition"] == "service_completed_successfully"
    )
    for name in WORKER_SERVICES:
        url = environment_of(services[name])["FLIGHTDECK_SERVICE_URL"]
        assert url == "http://service:8000", name


def test_workers_have_shared_memory_for_dataloaders(services: dict[str, Any]) -> None:
    for name in WORKER_SERVICES:
        service = services[name]
        assert service.get("ipc") == "host" or _bytes(service["shm_size"]) >= 1024**3, name


def test_database_lives_on_a_named_volume(compose: dict[str, Any], services: dict[str, Any]) -> None:
    service = services["service"]
    command = service["command"]
    data_dir = command[command.index("--data-dir") + 1]
    [mount] = [m for m in mounts_of(service) if m.target == data_dir]
    assert is_named_volume(mount.source) and mount.source in compose["volumes"]


def test_workers_mount_models_data_and_runs_in_their_workspace(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    for name in (*WORKER_SERVICES, "demo-assets"):
        service = services[name]
        targets = {m.target for m in mounts_of(service)}
        assert {"/workspace/models", "/workspace/data", "/workspace/runs"} <= targets, name
        for mount in mounts_of(service):
            assert not is_named_volume(mount.source) or mount.source in compose["volumes"], mount
    for name in WORKER_SERVICES:
        env = environment_of(services[name])
        assert env["FLIGHTDECK_WORKSPACE"] == str(WORKSPACE)
        assert env["FLIGHTDECK_RUNS_DIR"] == "/workspace/runs"


def test_a_volume_variable_set_to_a_host_path_becomes_a_bind_mount(compose_env: dict[str, str]) -> None:
    compose = load_compose({**compose_env, "FLIGHTDECK_MODELS_VOLUME": "/srv/models"})
    [mount] = [m for m in mounts_of(compose["services"]["worker"]) if m.target == "/workspace/models"]
    assert mount.source == "/srv/models" and not is_named_volume(mount.source)


def _recipe_paths(recipe: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(where, kind, path) for model and data paths of a recipe and each of its stages."""
    found = []
    parts = [("", recipe)] + [(f"stages[{i}].", s) for i, s in enumerate(recipe.get("stages") or [])]
    for prefix, part in parts:
        model_path = (part.get("model") or {}).get("path")
        if model_path:
            found.append((f"{prefix}model.path", "model", model_path))
        for split in ("train", "eval"):
            for i, source in enumerate((part.get("data") or {}).get(split) or []):
                found.append((f"{prefix}data.{split}[{i}].path", "data", source["path"]))
    return found


def _is_hub_id(path: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", path) is not None and path.split("/")[0] not in (
        "models",
        "data",
        "runs",
    )


def test_there_are_example_recipes_to_check() -> None:
    assert DEMO_RECIPE.exists(), "examples/tiny-demo.json is what the cpu profile's demo-job submits"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_paths_sit_under_the_workers_mounts(example: Path, services: dict[str, Any]) -> None:
    recipe = json.loads(example.read_text(encoding="utf-8"))
    for name in WORKER_SERVICES:
        targets = [PurePosixPath(m.target) for m in mounts_of(services[name])]
        for where, kind, path in _recipe_paths(recipe):
            if path == "@previous" or (kind == "model" and _is_hub_id(path)):
                continue
            in_container = PurePosixPath(path) if path.startswith("/") else WORKSPACE / path
            assert any(in_container.is_relative_to(t) for t in targets), (
                f"{example.name} {where}={path!r} is {in_container} in the {name} container, "
                f"outside every mount ({', '.join(map(str, targets))})"
            )


def _uses_tiny_models(recipe: dict[str, Any]) -> bool:
    models = [p for _, kind, p in _recipe_paths(recipe) if kind == "model" and p != "@previous"]
    return bool(models) and all(p.startswith("models/tiny-") for p in models)


TINY_EXAMPLES = [p for p in EXAMPLES if _uses_tiny_models(json.loads(p.read_text(encoding="utf-8")))]


def test_the_demo_recipe_uses_tiny_models() -> None:
    assert DEMO_RECIPE in TINY_EXAMPLES


@pytest.mark.parametrize("example", TINY_EXAMPLES, ids=[p.name for p in TINY_EXAMPLES])
def test_demo_assets_write_what_tiny_examples_read(
    example: Path, services: dict[str, Any], demo_data: Path
) -> None:
    script = services["demo-assets"]["command"][0]
    for where, kind, path in _recipe_paths(json.loads(example.read_text(encoding="utf-8"))):
        if kind == "model" and path != "@previous":
            assert f"make-tiny-model {WORKSPACE / path} " in script, (
                f"{where}={path!r} is not built by demo-assets"
            )
        elif kind == "data":
            assert (demo_data / path).exists(), f"{where}={path!r} is not written by make-demo-data"
    assert f"make-demo-data {WORKSPACE / 'data'}" in script


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `flightdeck make-demo-data /workspace/data` writes, under <tmp>/data."""
    from flightdeck.worker.tiny.demo_data import make_demo_data

    root = tmp_path_factory.mktemp("workspace")
    make_demo_data(root / "data", seed=0, text_lines=10)
    return root


def test_demo_recipe_fits_the_cpu_worker(compose_env: dict[str, str]) -> None:
    from flightdeck.recipe import parse_recipe

    recipe = parse_recipe(json.loads(DEMO_RECIPE.read_text(encoding="utf-8")))
    slots = int(interpolate("${FLIGHTDECK_CPU_SLOTS:-2}", compose_env))
    assert recipe.resources.nodes == 1
    assert recipe.processes_per_node <= slots, "the cpu profile's worker could never claim the demo job"


def test_demo_job_submits_a_recipe_that_is_mounted(services: dict[str, Any]) -> None:
    job = services["demo-job"]
    recipe_arg = job["command"][job["command"].index("submit") + 1]
    [mount] = [m for m in mounts_of(job) if PurePosixPath(recipe_arg).is_relative_to(m.target)]
    assert mount.read_only
    host_file = (ROOT / mount.source / PurePosixPath(recipe_arg).relative_to(mount.target)).resolve()
    assert host_file == DEMO_RECIPE.resolve()


# --- postgres profile ---

POSTGRES_DATA = "/var/lib/postgresql/data"


def test_postgres_runs_only_in_its_profile(compose: dict[str, Any], services: dict[str, Any]) -> None:
    postgres = services["postgres"]
    assert postgres["profiles"] == ["postgres"]
    assert postgres["image"] == "postgres:15-bookworm"
    # The service reaches it on the compose network; a published port would expose the database.
    assert "ports" not in postgres
    for profiles in (set(), {"gpu"}, {"cpu"}):
        assert "postgres" not in enabled_services(compose, profiles), profiles
    assert "postgres" in enabled_services(compose, {"gpu", "postgres"})


def test_postgres_has_a_health_check_that_logs_in_as_the_service_will(services: dict[str, Any]) -> None:
    postgres = services["postgres"]
    env = environment_of(postgres)
    check = postgres["healthcheck"]
    assert check["test"][0] in ("CMD", "CMD-SHELL") and "pg_isready" in check["test"][1:]
    words = check["test"][1:]
    assert words[words.index("-U") + 1] == env["POSTGRES_USER"] == "flightdeck"
    assert words[words.index("-d") + 1] == env["POSTGRES_DB"] == "flightdeck"
    # TCP, not the socket the image's temporary init server listens on.
    assert words[words.index("-h") + 1] == "127.0.0.1"
    assert _seconds(check["timeout"]) < _seconds(check["interval"]) <= 10
    assert int(check["retries"]) >= 3 and _seconds(check["start_period"]) > 0
    assert not check.get("disable", False)


def test_postgres_keeps_its_data_on_a_declared_named_volume(
    compose_raw: dict[str, Any], compose: dict[str, Any], services: dict[str, Any]
) -> None:
    [mount] = [m for m in mounts_of(services["postgres"]) if m.target == POSTGRES_DATA]
    assert is_named_volume(mount.source) and not mount.read_only
    assert mount.source in compose_raw["volumes"] and mount.source in compose["volumes"]
    # Its own volume: sharing the service's db volume would mix SQLite files into PGDATA.
    assert mount.source not in {m.source for m in mounts_of(services["service"])}


def test_postgres_password_comes_from_the_environment(compose_env: dict[str, str]) -> None:
    def password(env: dict[str, str]) -> str:
        return environment_of(load_compose(env)["services"]["postgres"])["POSTGRES_PASSWORD"]

    assert compose_env["FLIGHTDECK_POSTGRES_PASSWORD"] == ""
    assert password(compose_env) == "flightdeck"  # the image refuses to initialise without one
    assert password({**compose_env, "FLIGHTDECK_POSTGRES_PASSWORD": "s3cret"}) == "s3cret"


def test_database_url_passes_through_to_the_service(compose_env: dict[str, str]) -> None:
    def database_url(env: dict[str, str]) -> str:
        return environment_of(load_compose(env)["services"]["service"])["DATABASE_URL"]

    # .env.example leaves it empty: the SQLite default (test_empty_database_url_means_sqlite).
    assert database_url(compose_env) == ""
    assert database_url({k: v for k, v in compose_env.items() if k != "DATABASE_URL"}) == ""
    url = "postgresql+psycopg://flightdeck:p%40ss@postgres:5432/flightdeck"
    assert database_url({**compose_env, "DATABASE_URL": url}) == url


def test_empty_database_url_means_sqlite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from flightdeck.service.core.config import Settings

    monkeypatch.setenv("DATABASE_URL", "")
    monkeypatch.setenv("FLIGHTDECK_DATA_DIR", str(tmp_path))
    assert Settings().database_url == f"sqlite:///{(tmp_path / 'flightdeck.db').resolve()}"


def test_the_service_waits_for_postgres_only_when_its_profile_is_on(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    dependency = dependencies_of(services["service"])["postgres"]
    assert dependency["condition"] == "service_healthy"
    # Not required: a plain `docker compose up` (or --profile cpu) leaves postgres out and must still start.
    assert dependency["required"] is False
    for profiles in (set(), {"gpu"}, {"cpu"}, {"postgres"}, {"gpu", "postgres"}, {"cpu", "postgres"}):
        assert unmet_dependencies(compose, profiles) == [], profiles


def test_the_dependency_check_sees_a_required_dependency_on_a_disabled_service(
    compose: dict[str, Any],
) -> None:
    required = copy.deepcopy(compose)
    required["services"]["service"]["depends_on"]["postgres"]["required"] = True
    assert unmet_dependencies(required, {"gpu"}) == ["service -> postgres"]
    assert unmet_dependencies(required, {"gpu", "postgres"}) == []
    del required["services"]["service"]["depends_on"]["postgres"]["required"]
    assert unmet_dependencies(required, set()) == ["service -> postgres"]


def _documented_database_urls() -> list[str]:
    text = COMPOSE_GUIDE.read_text(encoding="utf-8") + COMPOSE_FILE.read_text(encoding="utf-8")
    return re.findall(r"postgresql\+psycopg://[^\s`'\")]+", text)


def test_the_documented_url_reaches_the_postgres_service(compose: dict[str, Any]) -> None:
    from urllib.parse import urlsplit

    postgres = environment_of(compose["services"]["postgres"])
    urls = _documented_database_urls()
    assert len(urls) >= 3, urls  # the command and the .env lines in the guide, the compose.yaml header
    for url in urls:
        parts = urlsplit(url)
        assert parts.scheme == "postgresql+psycopg", url
        assert parts.hostname == "postgres" and "postgres" in compose["services"], url
        assert parts.port == 5432, url
        assert parts.username == postgres["POSTGRES_USER"], url
        assert parts.password == postgres["POSTGRES_PASSWORD"], url  # .env.example's default password
        assert parts.path == f"/{postgres['POSTGRES_DB']}", url


def test_the_guide_gives_the_postgres_command_and_back_up() -> None:
    guide = COMPOSE_GUIDE.read_text(encoding="utf-8")
    section = guide.partition("## PostgreSQL instead of SQLite")[2].partition("\n## ")[0]
    assert section, "docs/compose.md has no PostgreSQL section"
    assert re.search(r"DATABASE_URL=postgresql\+psycopg://\S+ docker compose --profile postgres up", section)
    assert "docker compose exec postgres pg_dump -U flightdeck flightdeck > flightdeck.sql" in section
    assert "FLIGHTDECK_POSTGRES_PASSWORD" in section and "postgresql+psycopg://" in section


def test_env_example_lists_exactly_the_variables_compose_reads(env_example: dict[str, str]) -> None:
    used = variables_in(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert used - set(env_example) == set(), "add these to .env.example"
    unused = {name for name in set(env_example) - used if not name.startswith("COMPOSE_")}
    assert unused == set(), "compose.yaml never reads these"


def test_secrets_are_required_from_the_environment(compose_env: dict[str, str]) -> None:
    for name in ("FLIGHTDECK_USER_TOKEN", "FLIGHTDECK_WORKER_TOKEN"):
        with pytest.raises(MissingVariable, match=name):
            load_compose({**compose_env, name: ""})


# Secrets with a default. The postgres profile's password: the server publishes no port, and a plain
# `docker compose up` interpolates this file too, so demanding it would break the SQLite default.
DEFAULTED_SECRETS = {("postgres", "POSTGRES_PASSWORD"): "${FLIGHTDECK_POSTGRES_PASSWORD:-flightdeck}"}


def test_no_secret_is_written_in_compose_dockerfiles_or_env_example(
    compose_raw: dict[str, Any], env_example: dict[str, str]
) -> None:
    for path in (COMPOSE_FILE, ENV_EXAMPLE, *DOCKERFILES.values()):
        assert secret_like_strings(path.read_text(encoding="utf-8")) == [], path.name
    # A database URL carries its password.
    secret_name = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|CREDENTIAL|DATABASE_URL")
    for name, value in env_example.items():
        if secret_name.search(name):
            assert value == "", f".env.example gives {name} a value"
    for service_name, service in compose_raw["services"].items():
        for name, value in environment_of(service).items():
            if (service_name, name) in DEFAULTED_SECRETS:
                assert value == DEFAULTED_SECRETS[service_name, name]
                assert "ports" not in service, f"{service_name} has a default password and a published port"
                continue
            if secret_name.search(name):
                assert re.fullmatch(r"\$\{[A-Z0-9_]+(:\?[^}]*|:-)?\}", value), (
                    f"{service_name}: {name}={value!r}"
                )
    for dockerfile in DOCKERFILES.values():
        for line in dockerfile.read_text(encoding="utf-8").splitlines():
            if re.match(r"\s*(ENV|ARG)\b", line):
                assert not secret_name.search(line), f"{dockerfile.name}: {line}"


def test_the_secret_detector_finds_real_looking_tokens() -> None:
    urlsafe = base64.urlsafe_b64encode(hashlib.sha256(b"flightdeck").digest()).decode().rstrip("=")
    for token in (secrets.token_hex(32), urlsafe, "hf_" + "Ab3" * 10, "ghp_" + "x1" * 18):
        assert secret_like_strings(f"FLIGHTDECK_WORKER_TOKEN: {token}\n"), token
    assert secret_like_strings("FLIGHTDECK_WORKER_SHM_SIZE=16gb image: pytorch/pytorch:2.8.0-cuda12.8") == []


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration):
        total += float(number) * units[unit]
    assert total > 0, duration
    return total


def _bytes(size: str | int) -> int:
    match = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(size).lower())
    assert match, size
    return int(match.group(1)) << (10 * " kmg".index(match.group(2) or " "))
