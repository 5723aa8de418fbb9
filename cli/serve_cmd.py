"""`flightdeck serve`: the control plane on one port."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer


def register(app: typer.Typer) -> None:
    app.command()(serve)


def shown_url(url: str) -> str:
    """The database URL as printed: a PostgreSQL password never reaches a terminal or a log."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


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

    from flightdeck.service.api.app import create_app
    from flightdeck.service.core.config import Settings

    if data_dir is not None:
        os.environ["FLIGHTDECK_DATA_DIR"] = str(data_dir)
    settings = Settings()
    typer.echo(
        f"flightdeck: data in {settings.data_dir.resolve()}, database {shown_url(settings.database_url)}"
    )
    # Tuned once start-up is over: uvicorn, the migrations and the database drivers import hundreds
    # of modules after create_app returns, and those must be frozen too.
    app = create_app(settings, on_started=tune_gc)
    # A bounded graceful shutdown: open SSE streams (dashboards, logs --follow) must not delay a stop.
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False, timeout_graceful_shutdown=5
    )
    stopping_server(config).run()


def stopping_server(config: Any) -> Any:
    """uvicorn's server, telling the app the moment a stop begins: long-polling claims answer 204 and
    streams end within a poll, instead of being cancelled at the end of the grace period (a
    CancelledError traceback in the service's log, an HTTP 500 in the agent's)."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            state = getattr(config.app.state, "flightdeck", None)
            if state is not None:
                state.queue.stop()
            super().handle_exit(sig, frame)

    return StoppingServer(config)


def tune_gc() -> None:
    """The service process's garbage collector, set for a server that allocates fast per request.

    Everything built so far (modules, the app, its routes and schemas) lives as long as the process:
    frozen, the cyclic GC stops re-scanning it. Unfrozen, each full collection under load took
    100-135 ms, the whole tail of claim latency. Requests allocate fast and free by reference
    counting; at the default thresholds young collections took about 10% of the service's CPU under
    50 claiming agents, at these about 1% (bench/README.md).
    """
    gc.collect()  # what is garbage now must not be frozen with the rest
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
