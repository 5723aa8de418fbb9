"""Host preflight: the rules that need the real GPUs, files, ports and environment of a worker.

run_host_preflight(recipe: Recipe, inventory: WorkerInventory, workspace: str | Path,
                   devices: list[int], *, environ: Mapping[str, str] | None = None) -> PreflightResult
    `.findings` and `.effective`, the recipe with host fixes applied (sdpa, a capped sequence length,
    a pad token, a free MASTER_PORT for a busy pinned one). The launch environment is the plan's.
find_free_port() -> int, port_is_free(port) -> bool   (E002)
"""

from flightdeck.worker.host_preflight.ports import find_free_port, port_is_free
from flightdeck.worker.host_preflight.run import run_host_preflight

__all__ = ["find_free_port", "port_is_free", "run_host_preflight"]
