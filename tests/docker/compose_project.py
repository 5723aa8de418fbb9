"""The repository's compose.yaml driven with `docker compose` against a test engine, as a user would."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.docker.engine import CommandResult, DockerEngine

ROOT = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = ROOT / ".env.example"

USER_TOKEN = "docker-test-user-token"
WORKER_TOKEN = "docker-test-worker-token"
# Not the default 8000, so the test also shows FLIGHTDECK_HTTP_PORT reaches the published port.
HTTP_PORT = 18000


def env_file_text(**values: str | None) -> str:
    """.env.example as a user fills it in: the tokens set, then `values` (None deletes a line)."""
    filled: dict[str, str | None] = {
        "FLIGHTDECK_USER_TOKEN": USER_TOKEN,
        "FLIGHTDECK_WORKER_TOKEN": WORKER_TOKEN,
        "FLIGHTDECK_HTTP_PORT": str(HTTP_PORT),
        **values,
    }
    lines = []
    for line in ENV_EXAMPLE.read_text().splitlines():
        name = line.split("=", 1)[0] if "=" in line and not line.startswith("#") else None
        if name in filled:
            if filled[name] is None:
                continue
            line = f"{name}={filled[name]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class ComposeProject:
    """`docker compose --env-file ENV --profile ...` in the repository root, on `engine`."""

    def __init__(self, engine: DockerEngine, env_file: Path, profiles: list[str]) -> None:
        self.engine = engine
        self.env_file = env_file
        self.profiles = profiles

    def compose(self, *args: str, timeout: float = 600, profiles: list[str] | None = None) -> CommandResult:
        flags = [
            item
            for profile in (self.profiles if profiles is None else profiles)
            for item in ("--profile", profile)
        ]
        return self.engine.docker(
            "compose", "--env-file", str(self.env_file), *flags, *args, cwd=ROOT, timeout=timeout
        )

    def exec(self, service: str, *command: str, user: str | None = None) -> CommandResult:
        as_user = ["--user", user] if user else []
        return self.compose("exec", "-T", *as_user, service, *command, timeout=120)

    def container_id(self, service: str) -> str:
        ids = self.compose("ps", "-a", "-q", service).check().stdout.split()
        assert len(ids) == 1, f"{service}: expected one container, found {ids}"
        return ids[0]

    def inspect(self, service: str) -> dict[str, Any]:
        result = self.engine.docker("inspect", self.container_id(service)).check()
        return json.loads(result.stdout)[0]  # type: ignore[no-any-return]

    def wait_exit(self, service: str, timeout: float) -> int:
        """Block until a one-shot service's container exits; its exit code."""
        result = self.engine.docker("wait", self.container_id(service), timeout=timeout).check()
        return int(result.stdout.strip())

    def logs(self, *services: str) -> str:
        return self.compose("logs", "--no-color", "--no-log-prefix", *services).stdout

    def http(self, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
        """A user's request to the published port, from inside the engine's network namespace."""
        command = [
            "curl", "-sS", "--fail-with-body", "--max-time", "20", "-X", method,
            "-H", f"Authorization: Bearer {USER_TOKEN}",
        ]  # fmt: skip
        if body is not None:
            command += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
        result = self.engine.in_netns([*command, f"http://127.0.0.1:{HTTP_PORT}{path}"]).check()
        return json.loads(result.stdout)

    def wait_for_job(self, job_id: int, statuses: set[str], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.http(f"/jobs/{job_id}")
            if job["status"] in statuses:
                return job
            time.sleep(2)
        raise AssertionError(
            f"job {job_id} still {job.get('status')} after {timeout} s:\n{self.logs('worker-cpu')[-4000:]}"
        )
