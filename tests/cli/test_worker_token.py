"""`flightdeck worker` takes its token from the environment or a file, never needing it on argv."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from flightdeck.cli.main import app
from tests.cli.live_service import WORKER_TOKEN, LiveService


@pytest.mark.slow  # a real agent process (about 15 s on 2 loaded cores)
def test_a_worker_started_with_token_file_registers_and_its_argv_holds_no_token(
    service: LiveService, tmp_path: Path
) -> None:
    # The service's own tokens.env, as the README's two-node example passes it.
    tokens = tmp_path / "tokens.env"
    tokens.write_text(
        f"FLIGHTDECK_USER_TOKENS=someone-else\nFLIGHTDECK_WORKER_TOKENS={WORKER_TOKEN},another\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    argv = [
        sys.executable,
        "-m",
        "flightdeck.cli.main",
        "worker",
        "--service",
        service.url,
        "--token-file",
        str(tokens),
    ]
    argv += ["--workspace", str(tmp_path), "--cpu-slots", "1", "--name", "from-a-file", "--poll-wait", "1"]
    worker = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and worker.poll() is None:
            names = [w["name"] for w in service.user.get("/workers").json()]
            if "from-a-file" in names:
                break
            time.sleep(0.3)
        assert worker.poll() is None, worker.stderr.read().decode() if worker.stderr else ""
        assert "from-a-file" in names
        assert WORKER_TOKEN not in " ".join(psutil.Process(worker.pid).cmdline())
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_a_worker_without_a_token_says_where_to_put_one(runner: CliRunner, tmp_path: Path) -> None:
    missing = runner.invoke(
        app, ["worker", "--service", "http://127.0.0.1:9"], env={"FLIGHTDECK_WORKER_TOKEN": ""}
    )
    assert (
        missing.exit_code == 2
        and "FLIGHTDECK_WORKER_TOKEN" in missing.output
        and "--token-file" in missing.output
    )
    empty = tmp_path / "empty"
    empty.write_text("\n")
    refused = runner.invoke(app, ["worker", "--service", "http://127.0.0.1:9", "--token-file", str(empty)])
    assert refused.exit_code == 2 and "holds no worker token" in refused.output


@pytest.mark.parametrize(
    ("text", "token"),
    [("tok-123\n", "tok-123"), ("FLIGHTDECK_USER_TOKENS=u\nFLIGHTDECK_WORKER_TOKENS=w1,w2\n", "w1")],
    ids=["plain-file", "service-tokens-env"],
)
def test_token_file_forms(tmp_path: Path, text: str, token: str) -> None:
    from flightdeck.cli.worker_cmd import _worker_token

    path = tmp_path / "token"
    path.write_text(text)
    assert _worker_token(None, path) == token


def test_a_worker_with_a_workspace_that_is_not_there_says_so_in_one_line(
    runner: CliRunner, tmp_path: Path
) -> None:
    for extra in (
        ["--workspace", str(tmp_path / "nowhere")],
        ["--workspace", str(tmp_path), "--allowed-root", str(tmp_path / "gone")],
    ):
        answer = runner.invoke(
            app, ["worker", "--service", "http://127.0.0.1:9", *extra], env={"FLIGHTDECK_WORKER_TOKEN": "w"}
        )
        assert answer.exit_code == 2 and "not a directory" in answer.output, answer.output
        assert answer.exception is None or isinstance(answer.exception, SystemExit), answer.exception
