"""`flightdeck serve`: the control plane on one port."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command()(serve)


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.", envvar="FLIGHTDECK_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", envvar="FLIGHTDECK_PORT")] = 8000,
    data_dir: Annotated[
        Path | None, typer.Option(help="Database and token directory.", envvar="FLIGHTDECK_DATA_DIR")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Start the Flightdeck service (creates and migrates the database on start)."""
    import uvicorn

    from service.api.app import create_app
    from service.core.config import Settings

    if data_dir is not None:
        os.environ["FLIGHTDECK_DATA_DIR"] = str(data_dir)
    settings = Settings()
    typer.echo(f"flightdeck: data in {settings.data_dir.resolve()}, database {settings.database_url}")
    # A bounded graceful shutdown: open SSE streams (dashboards, logs --follow) must not delay a stop.
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
