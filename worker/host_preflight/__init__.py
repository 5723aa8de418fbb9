"""Host preflight: the rules that need the real GPUs, files, ports and environment of a worker.

run_host_preflight(recipe: Recipe, inventory: WorkerInventory, workspace: str | Path,
                   devices: list[int], *, environ: Mapping[str, str] | None = None) -> PreflightResult
    `.findings` and `.effective`, the recipe with host fixes applied (sdpa, a capped sequence length,
    a pad token). The launch environment is the plan's.
resolve_master_port(pinned) -> ResolvedPort   the attempt's one port decision (E002)
find_free_port() -> int, port_is_free(port) -> bool

Each name is imported from its module when first asked for. A Slurm batch script runs
`python -m flightdeck.worker.host_preflight.ports` for its rendezvous port on every attempt; with the
rules imported here that command loaded torch and the data code first (3.3 s for one free port, and
runpy's warning that the module was imported before it ran).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flightdeck.worker.host_preflight.ports import (
        ResolvedPort,
        find_free_port,
        port_is_free,
        resolve_master_port,
    )
    from flightdeck.worker.host_preflight.run import run_host_preflight

_HOMES = {
    "ResolvedPort": "ports",
    "find_free_port": "ports",
    "port_is_free": "ports",
    "resolve_master_port": "ports",
    "run_host_preflight": "run",
}

__all__ = ["ResolvedPort", "find_free_port", "port_is_free", "resolve_master_port", "run_host_preflight"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
