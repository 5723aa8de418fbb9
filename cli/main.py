"""Assembles the `flightdeck` command from one module per command group.

Each module imports its heavy dependencies (FastAPI, torch) inside the command, so the
worker image (no FastAPI) and the service image (no torch) both run `flightdeck`.
"""

from __future__ import annotations

import typer

from flightdeck.cli import client_cmd, serve_cmd, tiny_cmd, worker_cmd

app = typer.Typer(
    name="flightdeck",
    help="Flightdeck: fine-tuning jobs checked against known failures before and during launch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for module in (serve_cmd, worker_cmd, client_cmd, tiny_cmd):
    module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
