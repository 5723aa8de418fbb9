"""Why a queued job waits: its needs against what each live worker offers, in words.

The claim picks jobs with one SQL condition (service/claims.py `_fits`); this is the same
test written for people, run only when someone looks at a queued job. tests/service/test_why_waiting.py
checks the two agree on every combination it tries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flightdeck.inventory import WorkerInventory


@dataclass(frozen=True)
class Needs:
    """What a job asks of a worker (the job's req_* columns)."""

    accelerator: str
    devices: int
    min_capability: float
    gpu_memory_mb: int
    script: bool
    nodes: int = 1

    def describe(self) -> str:
        kind = "gpu" if self.accelerator == "gpu" else "cpu" if self.accelerator == "cpu" else "gpu or cpu"
        parts = [f"{kind} x {self.devices}"]
        if self.min_capability and self.accelerator != "cpu":
            parts.append(f"compute capability >= {self.min_capability:g} (bf16 or FlashAttention-2)")
        if self.gpu_memory_mb and self.accelerator != "cpu":
            parts.append(f">= {self.gpu_memory_mb / 1024:g} GB per GPU")
        if self.script:
            parts.append("a worker that runs scripts")
        described = ", ".join(parts)
        return f"{self.nodes} workers with {described} each" if self.nodes > 1 else described


def offer(inventory: WorkerInventory) -> str:
    if inventory.gpus:
        return f"{len(inventory.gpus)} x {inventory.gpus[0].name}"
    return f"cpu x {inventory.cpu_slots}"


# A worker that cannot see its GPUs' properties (a Slurm partition's GRES names only a count and a type).
_UNKNOWN_FIX = "a Slurm worker learns it from its admin:"


def unmet(needs: Needs, inventory: WorkerInventory) -> list[str]:
    """What this worker lacks for the job (empty: it fits when its devices are free)."""
    lacks: list[str] = []
    if inventory.gpus:
        if needs.accelerator == "cpu":
            lacks.append("the job asks for CPU processes and this worker offers GPUs")
        if len(inventory.gpus) < needs.devices:
            lacks.append(f"{needs.devices} GPUs wanted, {len(inventory.gpus)} here")
        capability = min(g.capability for g in inventory.gpus)
        if capability < needs.min_capability:
            lacks.append(
                f"its GPUs' compute capability is unknown, so >= {needs.min_capability:g} is not proven "
                f"({_UNKNOWN_FIX} --slurm-gpu-capability)"
                if capability == 0
                else f"compute capability {capability:g} < {needs.min_capability:g}"
            )
        memory = min(g.memory_mb for g in inventory.gpus)
        if memory < needs.gpu_memory_mb:
            lacks.append(
                f"its GPUs' memory is unknown, so >= {needs.gpu_memory_mb / 1024:g} GB is not proven "
                f"({_UNKNOWN_FIX} --slurm-gpu-memory-gb)"
                if memory == 0
                else f"{memory / 1024:g} GB per GPU < {needs.gpu_memory_mb / 1024:g} GB"
            )
    else:
        if needs.accelerator == "gpu":
            lacks.append("the job needs GPUs and this worker has none")
        if inventory.cpu_slots < needs.devices:
            lacks.append(f"{needs.devices} CPU slots wanted, {inventory.cpu_slots} here")
    if needs.script and not inventory.runs_scripts:
        lacks.append("it runs no script jobs (--no-scripts)")
    return lacks


def waiting_reason(needs: Needs, live: Sequence[tuple[str, WorkerInventory]]) -> str:
    """One line saying why a queued job has not started, and what would start it."""
    wanted = f"the job needs {needs.describe()}"
    if not live:
        return f"no live worker: start one (`flightdeck worker`); {wanted}"
    fitting = [name for name, inventory in live if not unmet(needs, inventory)]
    if needs.nodes > 1 and len(fitting) < needs.nodes:
        have = f"{len(fitting)} live worker{'s' if len(fitting) != 1 else ''} fit{'s' if len(fitting) == 1 else ''}"
        return (
            f"a gang of {needs.nodes} workers is needed and {have} ({', '.join(fitting[:5]) or 'none'}): "
            f"start {needs.nodes - len(fitting)} more (`flightdeck worker`); {wanted}"
        )
    if needs.nodes > 1:
        return (
            f"gathering a gang of {needs.nodes} from {', '.join(fitting[:8])}: it starts when that many "
            f"have free devices at once (or after jobs ahead of it); {wanted}"
        )
    if fitting:
        return f"waiting for free devices on {', '.join(fitting[:5])} (or for jobs ahead of it); {wanted}"
    offers = "; ".join(
        f"{name} offers {offer(inv)}: {', '.join(unmet(needs, inv))}" for name, inv in live[:5]
    )
    return f"no live worker fits: {wanted}. {offers}"
