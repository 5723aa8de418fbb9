"""What a worker tells the service about its host: GPUs, CPU slots, cores, memory, address."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from flightdeck.recipe.nul import Identifier


class GpuInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, le=1023)
    name: Identifier = Field(max_length=200)
    memory_mb: int = Field(ge=0, le=10_000_000)
    compute_capability: str = Field("0.0", pattern=r"^\d{1,2}\.\d{1,2}$")
    uuid: Identifier | None = Field(None, max_length=200)

    @property
    def capability(self) -> float:
        return float(self.compute_capability)


class WorkerInventory(BaseModel):
    """GPUs, or CPU slots on a machine without GPUs (each slot runs one gloo process)."""

    model_config = ConfigDict(extra="forbid")

    hostname: Identifier = Field("localhost", max_length=255)
    address: Identifier = Field(
        "127.0.0.1", max_length=255, description="Address other nodes reach this host at."
    )
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=1024)
    cpu_slots: int = Field(0, ge=0, le=1024, description="CPU mode: processes this worker may run.")
    cores: int = Field(1, ge=1, le=100_000)
    nodes: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Nodes one attempt of this worker may span, each with the GPUs (or CPU slots) above: "
        "a cluster scheduler's partition (Slurm) starts a job of several nodes as one job of its own. "
        "1: a host; a job of several nodes then gathers a gang of such workers.",
    )
    memory_mb: int = Field(0, ge=0)
    nccl_p2p_ok: bool | None = Field(None, description="Whether GPU peer-to-peer works; None when unknown.")
    agent_version: Identifier = Field("", max_length=64)
    workspace: Identifier = Field(
        "", max_length=4096, description="Directory relative recipe paths resolve against."
    )
    runs_dir: Identifier = Field(
        "", max_length=4096, description="Directory the agent creates run directories in."
    )
    runs_scripts: bool = Field(
        True,
        description="Whether the worker runs script jobs (recipe entrypoint); --no-scripts turns it off.",
    )

    @property
    def accelerator(self) -> str:
        return "gpu" if self.gpus else "cpu"

    @property
    def device_count(self) -> int:
        return len(self.gpus) if self.gpus else self.cpu_slots

    def facts(self) -> str:
        """The facts a launch plan is built from, in words: '2 GPUs (GPU, 80 GB, compute 9.0), 16 cores'."""
        if not self.gpus:
            return f"no GPU: {self.cpu_slots} CPU slot(s) (gloo), {self.cores} core(s)"
        first = self.gpus[0]
        # 0: unknown (a Slurm partition's GRES names only a count and a type).
        memory = f"{first.memory_mb / 1024:.0f} GB" if first.memory_mb else "memory unknown"
        compute = first.compute_capability if first.capability else "unknown"
        kind = f"{first.name}, {memory}, compute {compute}"
        return f"{len(self.gpus)} GPU(s) ({kind}), {self.cores} core(s)"


def notional_inventory(devices: int, accelerator: str, gpu_memory_gb: float | None = None) -> WorkerInventory:
    """A worker with exactly `devices` of the kind asked for: where a dry run previews the launch plan
    when no real worker is described (GPUs shown as Hopper-class with the memory asked for, or 80 GB)."""
    if accelerator == "cpu":
        return WorkerInventory(hostname="any-worker", cpu_slots=devices, cores=max(devices, 1))
    memory_mb = int((gpu_memory_gb or 80) * 1024)
    gpus = [
        GpuInfo(index=i, name="GPU", memory_mb=memory_mb, compute_capability="9.0") for i in range(devices)
    ]
    return WorkerInventory(hostname="any-worker", gpus=gpus, cores=max(8 * devices, 1))
