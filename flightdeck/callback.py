"""The stable import path for a user's own training script: `from flightdeck.callback import FlightdeckCallback`.

The callback's home is flightdeck.worker.callback (docs/own-script.md); scripts import it from here so
that home can move without breaking them. FlightdeckCallback is resolved when first asked for: a plain
loop that imports only LoopMonitor does not load transformers' trainer (worker/script_run.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flightdeck.worker.loop_monitor import LoopMonitor
from flightdeck.worker.train.health import HealthStop

if TYPE_CHECKING:
    from flightdeck.worker.callback import FlightdeckCallback

__all__ = ["FlightdeckCallback", "HealthStop", "LoopMonitor"]


def __getattr__(name: str) -> Any:
    if name == "FlightdeckCallback":
        from flightdeck.worker.callback import FlightdeckCallback

        return FlightdeckCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
