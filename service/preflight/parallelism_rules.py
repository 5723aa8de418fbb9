"""Static rules about how the model is placed on GPUs and processes (P001, P002, P003, P006)."""

from __future__ import annotations

from service.memory.architecture import ModelShape
from service.preflight.rule_result import RuleResult, correction, error
from service.recipe.schema import Recipe

OFFLOAD_DEVICES = ("cpu", "disk", "meta")


def device_map_under_ddp(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """P001: a device-mapped model cannot be a DDP replica (one process per node, or no device map)."""
    model = recipe.model
    if model is None:
        return []
    device_map = model.device_map
    if device_map is None:
        return []
    if recipe.resources.nodes > 1:
        return [
            error(
                "P001",
                "model.device_map",
                f"device_map '{device_map}' with {recipe.resources.nodes} nodes would run DDP over "
                "device-mapped replicas ('You can't train a model that has been loaded with "
                "device_map=auto in any distributed mode'). Set model.device_map to null (one full "
                "replica per GPU, DDP) or resources.nodes to 1 (model parallel on one node).",
            )
        ]
    if recipe.env.get("SHIRG_NO_DEVICE_MAP") == "1":
        return [
            correction(
                "P001",
                "model.device_map",
                f"env SHIRG_NO_DEVICE_MAP=1 asks for DDP without a device map but model.device_map is "
                f"'{device_map}'; the model is loaded without a device map so DDP owns placement.",
                "model.device_map set to null",
                {"model.device_map": None},
            )
        ]
    return []


def device_map_with_data_parallel(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """P002: one process over several GPUs must never be wrapped in DataParallel."""
    model = recipe.model
    if model is None or model.device_map is None or recipe.resources.gpus_per_node < 2:
        return []
    return [
        correction(
            "P002",
            "model.device_map",
            f"device_map '{model.device_map}' spreads one process over "
            f"{recipe.resources.gpus_per_node} GPUs; the HF Trainer would wrap it in DataParallel "
            "(dtype mismatch at lm_head, half the steps per epoch).",
            "the trainer sets training_args._n_gpu = 1 before the Trainer is built (transformers does so "
            "itself only when it detects the device map spanning several GPUs, which a local-checkpoint load "
            "can hide) and stops at step 0 if the model is still wrapped in DataParallel or the planned "
            "steps differ",
        )
    ]


def offloaded_weights(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """P003: weights offloaded to cpu/disk/meta cannot be trained."""
    model = recipe.model
    if model is None:
        return []
    offloaded = sorted(k for k in (model.max_memory or {}) if k.lower() in OFFLOAD_DEVICES)
    if not offloaded:
        return []
    return [
        error(
            "P003",
            f"model.max_memory.{offloaded[0]}",
            f"max_memory offloads weights to {', '.join(offloaded)}; training offloaded (meta) weights fails "
            "with 'returned an invalid gradient ... expected device meta'. Remove those entries and fit "
            "the model with quantization '4bit', a smaller batch, or more GPUs.",
        )
    ]


def quantised_replicas(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """P006: each DDP rank must load its quantised replica onto its own GPU."""
    model = recipe.model
    if model is None or model.quantization is None or model.device_map is not None or recipe.world_size < 2:
        return []
    return [
        correction(
            "P006",
            "model.quantization",
            f"a {model.quantization} model under DDP ({recipe.world_size} processes) would load every "
            "replica onto GPU 0.",
            "the trainer loads the quantised model with device_map={'': LOCAL_RANK}",
        )
    ]


PARALLELISM_RULES = (
    device_map_under_ddp,
    device_map_with_data_parallel,
    offloaded_weights,
    quantised_replicas,
)
