"""Host rules from the worker's described inventory alone (X001, X004, P004, M001, M002).

The launch environment (E003 threads, E005 NCCL peer-to-peer) is no rule here: the launch plan decides
it once, at claim, from the same inventory (flightdeck/launch/plan.py).

Pure functions: the agent runs them against the real inventory before launch, and POST /preflight
runs them against a described host for the dry run.
"""

from __future__ import annotations

from collections.abc import Callable

from flightdeck.inventory import GpuInfo, WorkerInventory
from flightdeck.launch.hardware import AMPERE_CAPABILITY
from flightdeck.memory.architecture import ModelShape
from flightdeck.memory.estimate import GB, estimate_memory, missing_for_estimate
from flightdeck.memory.fitting import cheapest_fitting_change
from flightdeck.preflight.rule_result import RuleResult, correction, error, warn
from flightdeck.recipe.schema import Recipe

HostRule = Callable[[Recipe, WorkerInventory, list[int], ModelShape | None], list[RuleResult]]

NEAR_LIMIT = 0.9


def used_gpus(recipe: Recipe, inventory: WorkerInventory, devices: list[int]) -> list[GpuInfo]:
    """The GPUs this attempt will use: the assigned devices, else the first gpus_per_node."""
    chosen = [g for g in inventory.gpus if g.index in devices] if devices else list(inventory.gpus)
    return chosen[: recipe.resources.gpus_per_node]


def gpu_count(
    recipe: Recipe, inventory: WorkerInventory, devices: list[int], _: ModelShape | None
) -> list[RuleResult]:
    """P004: more processes (or device-mapped GPUs) than the worker has (GPUs, or CPU slots)."""
    if recipe.resources.accelerator == "gpu" and not inventory.gpus:
        return [
            error(
                "P004",
                "resources.accelerator",
                "the job needs GPUs but this worker has none; set resources.accelerator to 'cpu' or 'any' "
                "to run on CPU slots.",
                "host",
            )
        ]
    if inventory.gpus:
        available = len([g for g in inventory.gpus if g.index in devices]) if devices else len(inventory.gpus)
    else:
        available = inventory.cpu_slots
    needed = recipe.resources.gpus_per_node
    if needed <= available:
        return []
    return [
        error(
            "P004",
            "resources.gpus_per_node",
            f"gpus_per_node {needed} but only {available} device(s) are available here ('invalid device "
            f"ordinal'); set gpus_per_node to {available} or run on a larger worker.",
            "host",
        )
    ]


def bf16_support(
    recipe: Recipe, inventory: WorkerInventory, devices: list[int], _: ModelShape | None
) -> list[RuleResult]:
    """X001: bf16 needs compute capability 8.0 (Ampere) or newer."""
    old = [g for g in used_gpus(recipe, inventory, devices) if g.capability < AMPERE_CAPABILITY]
    if recipe.training is None or recipe.training.precision != "bf16" or not old:
        return []
    return [
        error(
            "X001",
            "training.precision",
            f"{old[0].name} (compute capability {old[0].compute_capability}) has no bf16; set "
            "training.precision to 'fp16' (and model.dtype to 'float16' or 'float32').",
            "host",
        )
    ]


def flash_attention_support(
    recipe: Recipe, inventory: WorkerInventory, devices: list[int], _: ModelShape | None
) -> list[RuleResult]:
    """X004: FlashAttention 2 needs Ampere or newer."""
    model = recipe.model
    if model is None:
        return []
    old = [g for g in used_gpus(recipe, inventory, devices) if g.capability < AMPERE_CAPABILITY]
    if model.attn_implementation != "flash_attention_2" or not old:
        return []
    return [
        correction(
            "X004",
            "model.attn_implementation",
            f"flash_attention_2 does not run on {old[0].name} "
            f"(compute capability {old[0].compute_capability}).",
            "attn_implementation set to 'sdpa'",
            {"model.attn_implementation": "sdpa"},
            "host",
        )
    ]


def memory_fits(
    recipe: Recipe, inventory: WorkerInventory, devices: list[int], shape: ModelShape | None
) -> list[RuleResult]:
    """M001/M002: the estimated peak per GPU against the smallest GPU used."""
    gpus = used_gpus(recipe, inventory, devices)
    if shape is None or not gpus or missing_for_estimate(recipe):
        return []
    if any(g.memory_mb == 0 for g in gpus):
        return []  # memory unknown (a Slurm partition's GRES does not say it): nothing to check against
    budget = min(g.memory_mb for g in gpus) * 2**20
    estimate = estimate_memory(recipe, shape)
    if estimate.total <= NEAR_LIMIT * budget:
        return []
    if estimate.total <= budget:
        return [
            warn(
                "M002",
                "training.per_device_batch_size",
                f"estimated peak {estimate.total / GB:.1f} GB is over 90% of {budget / GB:.1f} GB per GPU "
                f"({estimate.table()}); fragmentation may still cause an OOM.",
                "host",
            )
        ]
    # Aim below the M002 line so the suggestion does not trade an error for a warning.
    change = cheapest_fitting_change(recipe, shape, NEAR_LIMIT * budget)
    advice = (
        f"cheapest change that fits: {change.description} (estimate {change.estimate.total / GB:.1f} GB)"
        if change
        else "no single recipe change fits; use GPUs with more memory or device_map over several GPUs"
    )
    return [
        error(
            "M001",
            "training.per_device_batch_size",
            f"estimated peak {estimate.total / GB:.1f} GB exceeds {budget / GB:.1f} GB per GPU "
            f"({estimate.table()}); {advice}.",
            "host",
        )
    ]


HOST_RULES: tuple[HostRule, ...] = (
    gpu_count,
    bf16_support,
    flash_attention_support,
    memory_fits,
)
