"""Host preflight: the rules that need the real GPUs, files, ports and environment of a worker.

run_host_preflight(recipe: Recipe, inventory: WorkerInventory, workspace: str | Path,
                   devices: list[int], *, environ: Mapping[str, str] | None = None) -> PreflightResult
    `.findings` and `.effective`, the recipe with host fixes applied (sdpa, a capped sequence length,
    a pad token). The launch environment is the plan's.
resolve_master_port(pinned) -> ResolvedPort   the attempt's one port decision (E002)
find_free_port() -> int, port_is_free(port) -> bool
"""

from flightdeck.worker.host_preflight.ports import (
    ResolvedPort,
    find_free_port,
    port_is_free,
    resolve_master_port,
)
from flightdeck.worker.host_preflight.run import run_host_preflight

__all__ = ["ResolvedPort", "find_free_port", "port_is_free", "resolve_master_port", "run_host_preflight"]
