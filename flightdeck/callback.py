"""The stable import path for a user's own training script: `from flightdeck.callback import FlightdeckCallback`.

The callback's home is flightdeck.worker.callback (docs/own-script.md); scripts import it from here so
that home can move without breaking them.
"""

from flightdeck.worker.callback import FlightdeckCallback, HealthStop, LoopMonitor

__all__ = ["FlightdeckCallback", "HealthStop", "LoopMonitor"]
