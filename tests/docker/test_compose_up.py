"""`docker compose up` for real: the project's images built and the cpu demo run end to end.

The tests share one engine and one Compose project and run in file order: the cpu profile comes up once,
its checks read the running containers, then it is taken down and brought up again, then the postgres
profile replaces SQLite. Base images are stand-ins built from Debian's packages (tests/docker/images);
the project's Dockerfiles, compose.yaml and .env.example are used unchanged.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker import base_images
from tests.docker.compose_project import (
    ENV_EXAMPLE,
    ROOT,
    ComposeProject,
    env_file_text,
)
from tests.docker.conftest import tear_down
from tests.docker.engine import DockerEngine

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

APP_UID = "10001"
DEMO_RECIPE = ROOT / "examples" / "tiny-demo.json"
DEMO_STEPS = json.loads(DEMO_RECIPE.read_text())["training"]["max_steps"]
POSTGRES_URL = "postgresql+psycopg://flightdeck:flightdeck@postgres:5432/flightdeck"
TOKEN_MESSAGE = "set {name} in .env (see .env.example)"


@pytest.fixture(scope="module")
def project(
    docker_engine: DockerEngine, project_images: dict[str, str], compose_env_file: Path
) -> Iterator[ComposeProject]:
    """The cpu profile's project; taken down with its volumes at the end, whatever happened."""
    project = ComposeProject(docker_engine, compose_env_file, ["cpu"])
    try:
        yield project
    finally:
        tear_down(project)


@pytest.fixture(scope="module")
def cpu_stack(project: ComposeProject) -> ComposeProject:
    """`docker compose --profile cpu up` and the demo job followed to its end."""
    project.compose("up", "--detach", timeout=900).check()
    exit_code = project.wait_exit("demo-job", timeout=900)
    assert exit_code == 0, f"demo-job exited {exit_code}:\n{project.logs('demo-job', 'worker-cpu')[-6000:]}"
    return project


def compose_config(project: ComposeProject) -> dict[str, Any]:
    return json.loads(project.compose("config", "--format", "json").check().stdout)  # type: ignore[no-any-return]


def env_example_names() -> set[str]:
    return {
        line.split("=", 1)[0]
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    }


# --- before anything is built -----------------------------------------------------------------------


def test_env_example_names_every_variable_compose_reads(
    docker_engine: DockerEngine, compose_env_file: Path
) -> None:
    project = ComposeProject(docker_engine, compose_env_file, ["cpu", "gpu", "postgres"])
    table = project.compose("config", "--variables").check().stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "REQUIRED"], table[0]
    compose_reads = {row.split()[0] for row in table[1:] if row.strip()}
    assert "FLIGHTDECK_USER_TOKEN" in compose_reads
    missing = compose_reads - env_example_names()
    assert not missing, f".env.example lacks {sorted(missing)}, which compose.yaml reads"


@pytest.mark.parametrize(
    ("token", "left_as"),
    [("FLIGHTDECK_USER_TOKEN", ""), ("FLIGHTDECK_WORKER_TOKEN", None)],
    ids=["user-token-empty-as-in-env-example", "worker-token-line-deleted"],
)
def test_compose_up_without_a_token_fails_with_the_promised_message(
    docker_engine: DockerEngine, tmp_path: Path, token: str, left_as: str | None
) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(env_file_text(**{token: left_as}))
    project = ComposeProject(docker_engine, env_file, ["cpu"])
    result = project.compose("up", "--detach", timeout=120)
    assert result.returncode != 0
    assert TOKEN_MESSAGE.format(name=token) in result.stderr, result.stderr
    assert not docker_engine.docker("ps", "-a", "-q").check().stdout.strip(), "a container was created"


# --- the cpu profile ----------------------------------------------------------------------------------


def test_cpu_profile_runs_the_demo_job_to_succeeded(cpu_stack: ComposeProject) -> None:
    assert cpu_stack.inspect("service")["State"]["Health"]["Status"] == "healthy"
    assert cpu_stack.wait_exit("demo-assets", timeout=10) == 0
    job = cpu_stack.http("/jobs/1")
    assert job["name"] == "tiny-demo"
    assert job["status"] == "succeeded", job
    assert job["last_step"] == DEMO_STEPS
    workers = cpu_stack.http("/workers")
    assert [w["name"] for w in workers if w["alive"]] == [job["worker_name"]]
    assert workers[0]["inventory"]["cpu_slots"] == 2
    assert "job 1 succeeded" in cpu_stack.logs("demo-job")
    # Through the published port (FLIGHTDECK_HTTP_PORT), as a user's browser or CLI reads them.
    metrics = cpu_stack.http(f"/jobs/1/metrics?limit={DEMO_STEPS + 10}")
    assert [point["step"] for point in metrics["points"]] == list(range(1, DEMO_STEPS + 1))
    assert all(point["values"]["loss"] > 0 for point in metrics["points"])


def test_demo_assets_wrote_the_models_and_data_every_example_reads(cpu_stack: ComposeProject) -> None:
    for recipe_path in sorted((ROOT / "examples").glob("*.json")):
        recipe = json.loads(recipe_path.read_text())
        paths = [recipe["model"]["path"], *(source["path"] for source in recipe["data"]["train"])]
        for path in paths:
            found = cpu_stack.exec("worker-cpu", "test", "-e", f"/workspace/{path}")
            assert found.returncode == 0, f"{recipe_path.name}: /workspace/{path} is missing"


def test_both_images_run_as_uid_10001_and_write_their_volumes(cpu_stack: ComposeProject) -> None:
    writable = {
        "service": ["/var/lib/flightdeck"],
        "worker-cpu": [
            "/workspace/models",
            "/workspace/data",
            "/workspace/runs",
            "/home/flightdeck/.cache/huggingface",
        ],
    }
    for service, directories in writable.items():
        assert cpu_stack.exec(service, "id", "-u").check().stdout.strip() == APP_UID
        assert cpu_stack.exec(service, "id", "-g").check().stdout.strip() == APP_UID
        for directory in directories:
            probe = f"{directory}/.write-probe"
            cpu_stack.exec(service, "sh", "-c", f"echo ok > {probe} && rm {probe}").check()
    # What the containers wrote in the run is theirs too: the database and the run directory.
    owner = cpu_stack.exec("service", "stat", "-c", "%u", "/var/lib/flightdeck/flightdeck.db").check()
    assert owner.stdout.strip() == APP_UID
    run_dir = cpu_stack.http("/jobs/1")["attempts"][-1]["plan"]["run_dir"]  # under the database's id
    owner = cpu_stack.exec("worker-cpu", "stat", "-c", "%u", run_dir).check()
    assert owner.stdout.strip() == APP_UID


def test_service_image_has_no_torch_and_the_worker_image_has_the_cpu_build(cpu_stack: ComposeProject) -> None:
    probe = "import importlib.util as u; s = u.find_spec('torch'); print(s.origin if s else None)"
    assert cpu_stack.exec("service", "python", "-c", probe).check().stdout.strip() == "None"
    version = cpu_stack.exec("worker-cpu", "python", "-c", "import torch; print(torch.__version__)").check()
    assert version.stdout.strip().endswith("+cpu")


def test_worker_shm_size_reaches_the_container(cpu_stack: ComposeProject) -> None:
    statvfs = "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize)"
    inside = int(cpu_stack.exec("worker-cpu", "python", "-c", statvfs).check().stdout)
    # Docker's default is 64 MB; compose.yaml asks for 2gb.
    assert inside == 2 * 1024**3, f"/dev/shm in worker-cpu is {inside} bytes"
    assert int(compose_config(cpu_stack)["services"]["worker-cpu"]["shm_size"]) == inside


def test_vision_language_example_succeeds_through_the_same_containers(cpu_stack: ComposeProject) -> None:
    recipe = json.loads((ROOT / "examples" / "r1-vision-lora-ddp.json").read_text())
    # Its 20 steps take minutes on two busy cores; a few show the image path, collator and ranks work.
    recipe["training"]["max_steps"] = 6
    job = cpu_stack.http("/jobs", method="POST", body=recipe)
    finished = cpu_stack.wait_for_job(job["id"], {"succeeded", "failed", "cancelled"}, timeout=600)
    assert finished["status"] == "succeeded", finished
    assert finished["last_step"] == recipe["training"]["max_steps"]


def test_script_job_succeeds_with_the_script_copied_into_the_workspace(cpu_stack: ComposeProject) -> None:
    # A script job runs a file of the worker's workspace; with named volumes it arrives by `compose cp`.
    cpu_stack.exec("worker-cpu", "mkdir", "-p", "/workspace/examples").check()
    cpu_stack.compose("cp", str(ROOT / "examples" / "own-script"), "worker-cpu:/workspace/examples/").check()
    recipe = json.loads((ROOT / "examples" / "own-script" / "plain-loop-job.json").read_text())
    job = cpu_stack.http("/jobs", method="POST", body=recipe)
    finished = cpu_stack.wait_for_job(job["id"], {"succeeded", "failed", "cancelled"}, timeout=600)
    assert finished["status"] == "succeeded", finished
    points = cpu_stack.http(f"/jobs/{job['id']}/metrics?limit=100")["points"]
    assert points, "the script's metrics did not reach the service"


PROCESS_LIST = """
import psutil
for p in psutil.process_iter(["status", "name", "ppid"]):
    if p.info["status"] == psutil.STATUS_ZOMBIE:
        print(f"zombie {p.info['name']} (pid {p.pid}, parent {p.info['ppid']})")
    else:
        print(" ".join(p.cmdline()))
"""


def command_lines(project: ComposeProject, service: str) -> list[str]:
    """Every process's command line in a running container ("zombie ..." for one); the images have no ps."""
    return project.exec(service, "python", "-c", PROCESS_LIST).check().stdout.splitlines()


def _grace_seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)s", value)
    assert match, f"stop_grace_period {value!r}: the test reads seconds only"
    return float(match.group(1))


def test_compose_stop_ends_the_torchrun_tree_within_the_grace_period(cpu_stack: ComposeProject) -> None:
    # After the jobs above (DataLoader workers, ranks outliving torchrun) the agent has reaped everything.
    zombies = [command for command in command_lines(cpu_stack, "worker-cpu") if command.startswith("zombie")]
    assert zombies == []
    recipe = json.loads(DEMO_RECIPE.read_text())
    recipe["name"] = "runs-until-stopped"
    recipe["training"]["max_steps"] = 100_000
    job = cpu_stack.http("/jobs", method="POST", body=recipe)
    cpu_stack.wait_for_job(job["id"], {"running"}, timeout=120)
    deadline = time.monotonic() + 120
    while True:
        tree = command_lines(cpu_stack, "worker-cpu")
        ranks = [c for c in tree if "-m flightdeck.worker.train" in c and "torch.distributed.run" not in c]
        if len(ranks) == 2:
            break
        assert time.monotonic() < deadline, f"no two training ranks in worker-cpu: {tree}"
        time.sleep(1)
    assert any("-m torch.distributed.run" in command for command in tree), tree

    grace = _grace_seconds(compose_config(cpu_stack)["services"]["worker-cpu"]["stop_grace_period"])
    started = time.monotonic()
    cpu_stack.compose("stop", "worker-cpu", timeout=grace + 60).check()
    took = time.monotonic() - started

    state = cpu_stack.inspect("worker-cpu")["State"]
    # 137 would be Docker's SIGKILL at the end of the grace period: the agent did not finish in time.
    assert state["ExitCode"] == 0, state
    assert took < grace, f"stop took {took:.1f} s of a {grace:.0f} s grace period"
    assert "stopping: running attempts are stopped" in cpu_stack.logs("worker-cpu")
    # torchrun says so when it is sent SIGTERM, which only the agent does: had the agent left the tree,
    # the kernel would have SIGKILLed it silently when the container's init exited. It logs "Received
    # 15 death signal"; "closing signal SIGTERM" follows only for ranks still alive by then (the agent
    # signals the ranks too, and they may already be gone).
    output_log = cpu_stack.http(f"/jobs/{job['id']}")["attempts"][-1]["plan"]["run_dir"] + "/output.log"
    shown = cpu_stack.compose("run", "--rm", "--no-deps", "--entrypoint", "cat", "demo-assets", output_log)
    assert re.search(r"Received 15 death signal|closing signal SIGTERM", shown.check().stdout), shown.stdout[
        -3000:
    ]
    cpu_stack.http(f"/jobs/{job['id']}/cancel", method="POST")


def test_down_then_up_keeps_the_job_and_its_metrics(cpu_stack: ComposeProject) -> None:
    before = cpu_stack.http(f"/jobs/1/metrics?limit={DEMO_STEPS + 10}")
    cpu_stack.compose("down", timeout=180).check()
    assert not cpu_stack.compose("ps", "-a", "-q").check().stdout.strip()
    cpu_stack.compose("up", "--detach", "--wait", "service", timeout=300).check()
    job = cpu_stack.http("/jobs/1")
    assert job["status"] == "succeeded"
    assert cpu_stack.http(f"/jobs/1/metrics?limit={DEMO_STEPS + 10}") == before


# --- the postgres profile -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def postgres_stack(
    project: ComposeProject, project_images: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> ComposeProject:
    """The cpu demo again with DATABASE_URL on the postgres profile's server (docs/compose.md's URL)."""
    project.compose("down", timeout=180).check()
    env_file = tmp_path_factory.mktemp("postgres") / ".env"
    env_file.write_text(env_file_text(DATABASE_URL=POSTGRES_URL))
    stack = ComposeProject(project.engine, env_file, ["cpu", "postgres"])
    image = compose_config(stack)["services"].get("postgres", {}).get("image")
    if image is None:
        pytest.skip("compose.yaml has no postgres profile")
    base_images.build_postgres(project.engine, project_images["python_base"], image)
    stack.compose("up", "--detach", timeout=900).check()
    exit_code = stack.wait_exit("demo-job", timeout=900)
    assert exit_code == 0, f"demo-job exited {exit_code}:\n{stack.logs('demo-job', 'service')[-6000:]}"
    return stack


def test_postgres_profile_runs_the_demo_job_and_keeps_it_across_down_and_up(
    postgres_stack: ComposeProject,
) -> None:
    assert POSTGRES_URL in (ROOT / "docs" / "compose.md").read_text()
    job = postgres_stack.http("/jobs/1")
    assert (job["name"], job["status"]) == ("tiny-demo", "succeeded")
    # The job is in PostgreSQL, not in the SQLite file of the db volume.
    query = "select status from jobs where id = 1"
    stored = postgres_stack.exec("postgres", "psql", "-U", "flightdeck", "-d", "flightdeck", "-tAc", query)
    assert stored.check().stdout.strip() == "succeeded"
    before = postgres_stack.http(f"/jobs/1/metrics?limit={DEMO_STEPS + 10}")
    assert len(before["points"]) == DEMO_STEPS

    postgres_stack.compose("down", timeout=180).check()
    postgres_stack.compose("up", "--detach", "--wait", "service", timeout=300).check()
    assert postgres_stack.http("/jobs/1")["status"] == "succeeded"
    assert postgres_stack.http(f"/jobs/1/metrics?limit={DEMO_STEPS + 10}") == before
