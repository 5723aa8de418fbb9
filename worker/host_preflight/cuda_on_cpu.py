"""E007 before launch: a script job on a CPU worker whose script hard-codes CUDA (warn).

The script is read as text on the host, where it lives: `.cuda(`, `torch.cuda.set_device` and an
`nccl` backend fail on a worker without GPUs (`Torch not compiled with CUDA enabled`, `_cuda_setDevice`).
A warning, not an error: the line may sit behind `torch.cuda.is_available()`.
"""

from __future__ import annotations

import re
from pathlib import Path

from flightdeck.inventory import WorkerInventory
from flightdeck.preflight.rule_result import RuleResult, warn
from flightdeck.recipe.schema import Recipe
from flightdeck.worker.path_confinement import module_file

_CUDA_ONLY = re.compile(r"\.cuda\(|set_device\(|['\"]nccl['\"]")
# A choice made on the same line ('nccl' if torch.cuda.is_available() else 'gloo') is portable.
_GUARDED = re.compile(r"is_available\(\)|device_count\(\)")
_SHOWN = 3


def cuda_on_cpu_findings(recipe: Recipe, inventory: WorkerInventory, workspace: Path) -> list[RuleResult]:
    entry = recipe.entrypoint
    if entry is None or inventory.gpus:
        return []
    if entry.script is not None:
        program = workspace / entry.script
    else:
        assert entry.module is not None
        program = module_file(entry.module, workspace)
    try:
        text = program.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []  # the entrypoint rule reports a missing file
    hits = [
        f"line {number}: {line.strip()[:80]}"
        for number, line in enumerate(text.splitlines(), 1)
        if _CUDA_ONLY.search(line) and not line.lstrip().startswith("#") and not _GUARDED.search(line)
    ]
    if not hits:
        return []
    path = "entrypoint.script" if entry.script is not None else "entrypoint.module"
    return [
        warn(
            "E007",
            path,
            f"this worker has no GPU but the script hard-codes CUDA ({'; '.join(hits[:_SHOWN])}"
            f"{'; ...' if len(hits) > _SHOWN else ''}): it fails with 'Torch not compiled with CUDA enabled' "
            "unless those lines are behind torch.cuda.is_available(); choose the device and the backend "
            "('gloo' without GPUs, $FLIGHTDECK_BACKEND) from what the host has",
            "host",
        )
    ]
