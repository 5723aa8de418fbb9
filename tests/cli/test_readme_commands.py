"""The README's commands as a newcomer pastes them: every option exists, no token on argv, no fixed port."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from flightdeck.cli.main import app

README = Path(__file__).resolve().parents[2] / "README.md"


def _bash_lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    # A trailing backslash continues the command on the next line.
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def _options(command: str) -> set[str]:
    click_app = typer.main.get_command(app)
    names = command.split()
    cmd = click_app
    for name in names:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return {opt for param in cmd.params for opt in (*param.opts, *param.secondary_opts)}


def test_every_flightdeck_option_in_the_readme_exists_and_no_token_is_on_argv() -> None:
    used = [
        line.split("#", 1)[0]
        for line in _bash_lines()
        if re.search(r"^\s*flightdeck (worker|preflight|submit|serve)\b", line)
    ]
    assert used, "the README shows flightdeck commands"
    for line in used:
        command = re.search(r"flightdeck (\w+)", line)[1]  # type: ignore[index]
        unknown = set(re.findall(r"(--[\w-]+)", line)) - _options(command)
        assert not unknown, (line, unknown)
        assert "--token " not in line and "$WORKER_TOKEN" not in line, line  # argv shows in every `ps`


def test_the_try_it_block_follows_flightdeck_port() -> None:
    lines = _bash_lines()
    assert any(re.search(r"FLIGHTDECK_URL=http://127\.0\.0\.1:\$FLIGHTDECK_PORT", line) for line in lines)
    assert not any(re.search(r"FLIGHTDECK_URL=http://127\.0\.0\.1:8000", line) for line in lines)
