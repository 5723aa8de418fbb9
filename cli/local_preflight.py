"""`flightdeck preflight` on this machine: the worker's own host check where the recipe's files are at hand.

The rules are the worker's (worker/agent/host_check.py: path confinement, then
worker/host_preflight/), run here against this host's inventory and a workspace on this disk; nothing
is re-implemented. Imported lazily: the host check needs torch and transformers, which the service
image lacks, and then the command names the checks it could not run instead.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightdeck.inventory import WorkerInventory
from flightdeck.recipe import Recipe
from flightdeck.recipe.schema import PREVIOUS_STAGE


@dataclass
class LocalHost:
    """This machine as a worker would register it, with the workspace the recipe's paths resolve in."""

    workspace: Path
    inventory: WorkerInventory
    model_config: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)


def workspace_holding(recipe: Recipe, explicit: Path | None, cwd: Path) -> Path | None:
    """`explicit`, else `cwd` when it holds at least one of the recipe's local paths, else None."""
    if explicit is not None:
        return explicit.resolve()
    from flightdeck.worker.path_confinement import recipe_paths

    if any((cwd / given).exists() for _, given in recipe_paths(recipe) if not Path(given).is_absolute()):
        return cwd.resolve()
    return None


def _model_config(recipe: Recipe, workspace: Path) -> dict[str, Any] | None:
    """The first stage's config.json when its model is a local directory (for the memory estimate)."""
    from flightdeck.recipe import expand_stages

    model = expand_stages(recipe)[0].model
    if model is None or model.path == PREVIOUS_STAGE:
        return None
    config = workspace / model.path / "config.json"
    try:
        loaded = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def describe_local_host(recipe: Recipe, workspace: Path, cpu_slots: int | None) -> LocalHost:
    """This host's inventory as `flightdeck worker --workspace WORKSPACE` would register it.

    A host without GPUs plans as a CPU worker with as many gloo processes as the recipe asks for (at
    most its cores) unless `cpu_slots` says otherwise: `flightdeck worker --cpu-slots N` does the same.
    """
    from flightdeck.worker.agent.inventory import detect_inventory

    notes: list[str] = []
    # The agent warns "running in CPU mode with N slot(s)" here; the note below says what is planned instead.
    agent_log = logging.getLogger("flightdeck.agent")
    level = agent_log.level
    agent_log.setLevel(logging.ERROR)
    try:
        inventory = detect_inventory(str(workspace), str(workspace / "runs"), cpu_slots)
    finally:
        agent_log.setLevel(level)
    if not inventory.gpus and cpu_slots is None:
        slots = max(1, min(recipe.resources.gpus_per_node, inventory.cores))
        inventory = inventory.model_copy(update={"cpu_slots": slots})
        notes.append(
            f"this host has no GPU: planned as a CPU worker with {slots} gloo process(es) on "
            f"{inventory.cores} core(s), as `flightdeck worker --cpu-slots {slots}` runs it"
        )
    return LocalHost(workspace, inventory, _model_config(recipe, workspace), notes)


def run_worker_host_check(effective: dict[str, Any], host: LocalHost) -> list[dict[str, Any]]:
    """The findings the worker's host check gives this recipe here (paths confined, then host rules)."""
    from flightdeck.worker.agent.host_check import run_host_check

    resources = Recipe.model_validate(effective).resources
    devices = [g.index for g in host.inventory.gpus][: resources.gpus_per_node]
    return run_host_check(effective, host.inventory, devices).findings
