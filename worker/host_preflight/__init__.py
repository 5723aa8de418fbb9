"""Host preflight: the rules that need the real GPUs, files, ports and environment of a worker.

run_host_preflight(recipe: Recipe, inventory: WorkerInventory, workspace: str | Path,
                   devices: list[int], *, environ: Mapping[str, str] | None = None) -> HostFindings
    HostFindings is a list[Finding] with `.effective`, the recipe with host fixes applied
    (OMP threads, NCCL P2P, sdpa, capped sequence length, a free MASTER_PORT).
find_free_port() -> int, port_is_free(port) -> bool   (E002)
"""

from worker.host_preflight.ports import find_free_port, port_is_free
from worker.host_preflight.run import HostFindings, host_preflight, run_host_preflight

__all__ = ["HostFindings", "find_free_port", "host_preflight", "port_is_free", "run_host_preflight"]
