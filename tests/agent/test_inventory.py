"""Inventory: nvidia-smi rows parsed into GPUs; --cpu-slots means CPU mode with the host's cores."""

from __future__ import annotations

import os

import pytest

from flightdeck.inventory import GpuInfo
from flightdeck.worker.agent import inventory as agent_inventory
from flightdeck.worker.agent.inventory import detect_inventory, parse_nvidia_smi

NVIDIA_SMI = """\
0, NVIDIA A100-SXM4-40GB, 40960, 8.0, GPU-1111
1, NVIDIA GeForce RTX 4090, 24564, 8.9, GPU-2222
2, Tesla V100-SXM2-16GB, 16160, [N/A], GPU-3333
"""


def test_nvidia_smi_rows_become_gpus() -> None:
    gpus = parse_nvidia_smi(NVIDIA_SMI)
    assert [(g.index, g.name, g.memory_mb) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-40GB", 40960),
        (1, "NVIDIA GeForce RTX 4090", 24564),
        (2, "Tesla V100-SXM2-16GB", 16160),
    ]
    assert [g.compute_capability for g in gpus] == ["8.0", "8.9", "0.0"]
    assert gpus[1].uuid == "GPU-2222"


def test_cpu_slots_mean_cpu_mode() -> None:
    inventory = detect_inventory("/ws", "/ws/runs", cpu_slots=3)
    assert inventory.gpus == [] and inventory.cpu_slots == 3 and inventory.device_count == 3
    assert inventory.accelerator == "cpu"
    assert inventory.cores == len(os.sched_getaffinity(0))
    assert inventory.memory_mb > 0
    assert (inventory.workspace, inventory.runs_dir) == ("/ws", "/ws/runs")


def test_a_host_with_no_gpu_offers_one_cpu_slot_per_core_it_may_run_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`flightdeck worker` started by hand on a GPU-less host runs the 2-process examples (with 1 slot
    they waited for a second one). The GPU probes answer "none", as on this machine; the affinity is 3 cores."""
    monkeypatch.setattr(agent_inventory, "_gpus_from_nvidia_smi", lambda: None)
    monkeypatch.setattr(agent_inventory, "_gpus_from_torch", lambda: [])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    inventory = detect_inventory("/ws", "/ws/runs", cpu_slots=None)
    assert inventory.gpus == [] and inventory.accelerator == "cpu"
    assert inventory.cpu_slots == inventory.cores == 3


def test_torch_gpus_under_a_split_host_keep_their_host_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without nvidia-smi, torch already shows only CUDA_VISIBLE_DEVICES=2,3, as its GPUs 0 and 1.
    renumbered = [GpuInfo(index=i, name="H100", memory_mb=80000, compute_capability="9.0") for i in (0, 1)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(agent_inventory, "_gpus_from_nvidia_smi", lambda: None)
    monkeypatch.setattr(agent_inventory, "_gpus_from_torch", lambda: renumbered)
    inventory = detect_inventory("/ws", "/ws/runs", cpu_slots=None)
    # The launch replaces the agent's CUDA_VISIBLE_DEVICES, so it must name the host's GPUs 2 and 3.
    assert [g.index for g in inventory.gpus] == [2, 3]


def test_nvidia_smi_gpus_are_limited_to_the_agents_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    monkeypatch.setattr(agent_inventory, "_gpus_from_nvidia_smi", lambda: parse_nvidia_smi(NVIDIA_SMI))
    inventory = detect_inventory("/ws", "/ws/runs", cpu_slots=None)
    assert [g.index for g in inventory.gpus] == [1, 2]
