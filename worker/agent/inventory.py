"""Detects what this host offers: GPUs via nvidia-smi (or torch), else CPU slots, cores, memory."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import socket
import subprocess

import psutil

from flightdeck.inventory import GpuInfo, WorkerInventory

log = logging.getLogger("flightdeck.agent")

NVIDIA_SMI_QUERY = "index,name,memory.total,compute_cap,uuid"


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """GPUs from `nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits` output."""
    gpus = []
    for row in text.strip().splitlines():
        parts = [part.strip() for part in row.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        capability = parts[3] if parts[3].replace(".", "", 1).isdigit() else "0.0"
        memory = int(float(parts[2])) if parts[2].replace(".", "", 1).isdigit() else 0
        uuid = parts[4] if len(parts) > 4 and parts[4] else None
        gpus.append(
            GpuInfo(
                index=int(parts[0]), name=parts[1], memory_mb=memory, compute_capability=capability, uuid=uuid
            )
        )
    return gpus


def _gpus_from_nvidia_smi() -> list[GpuInfo] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed (%s); trying torch", exc)
        return None
    return parse_nvidia_smi(out)


def _gpus_from_torch() -> list[GpuInfo]:
    """GPUs as torch numbers them: already limited to, and renumbered within, CUDA_VISIBLE_DEVICES."""
    # The launch sets PCI bus order (flightdeck/launch/plan.py); count in the same order here.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            GpuInfo(
                index=index,
                name=props.name,
                memory_mb=props.total_memory // (1024 * 1024),
                compute_capability=f"{props.major}.{props.minor}",
            )
        )
    return gpus


def _visible_indices() -> list[int] | None:
    """The agent's own CUDA_VISIBLE_DEVICES as host indices; None when unset or not plain indices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    parts = [part.strip() for part in (visible or "").split(",") if part.strip()]
    if visible is None or not all(part.isdigit() for part in parts):
        return None
    return [int(part) for part in parts]


def _visible(gpus: list[GpuInfo]) -> list[GpuInfo]:
    """Honour the agent's own CUDA_VISIBLE_DEVICES (indices) so a host can be split between agents."""
    wanted = _visible_indices()
    if wanted is None:
        return gpus
    return [gpu for gpu in gpus if gpu.index in wanted]


def _host_numbered(gpus: list[GpuInfo]) -> list[GpuInfo]:
    """torch's GPUs (already only the visible ones, renumbered from 0) under their host indices.

    The launch replaces the agent's CUDA_VISIBLE_DEVICES with the plan's, so the inventory must
    name GPUs as the host does: torch's i-th GPU is the i-th entry of CUDA_VISIBLE_DEVICES.
    """
    wanted = _visible_indices()
    if wanted is None or len(wanted) < len(gpus):
        return gpus
    return [gpu.model_copy(update={"index": wanted[i]}) for i, gpu in enumerate(gpus)]


def _address(explicit: str = "") -> str:
    explicit = explicit or os.environ.get("FLIGHTDECK_WORKER_ADDRESS", "")
    if explicit:
        return explicit
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def detect_inventory(
    workspace: str, runs_dir: str, cpu_slots: int | None, *, runs_scripts: bool = True, address: str = ""
) -> WorkerInventory:
    """The inventory this agent registers; `cpu_slots` set means CPU mode (gloo) even on a GPU host."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    gpus: list[GpuInfo] = []
    if cpu_slots is None:
        found = _gpus_from_nvidia_smi()
        gpus = _visible(found) if found is not None else _host_numbered(_gpus_from_torch())
        if not gpus:
            # One gloo process per core it may run on, as `flightdeck preflight` plans a GPU-less host: a
            # worker started by hand on a laptop runs the 2-process examples (with 1 slot they waited).
            cpu_slots = max(1, cores)
            log.warning(
                "no GPU found; running in CPU mode with %d slot(s), one per core (--cpu-slots to set)",
                cpu_slots,
            )
    try:
        version = importlib.metadata.version("flightdeck")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    return WorkerInventory(
        hostname=socket.gethostname()[:255],
        address=_address(address),
        gpus=gpus,
        cpu_slots=0 if gpus else int(cpu_slots or 1),
        cores=max(1, cores),
        memory_mb=psutil.virtual_memory().total // (1024 * 1024),
        agent_version=version,
        workspace=workspace,
        runs_dir=runs_dir,
        runs_scripts=runs_scripts,
    )
