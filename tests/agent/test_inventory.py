"""Inventory: nvidia-smi rows parsed into GPUs; --cpu-slots means CPU mode with the host's cores."""

from __future__ import annotations

import os

from worker.agent.inventory import detect_inventory, parse_nvidia_smi

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
