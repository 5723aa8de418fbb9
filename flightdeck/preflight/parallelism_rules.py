"""Static rules about how the model is placed on GPUs and processes (P001, P002, P003, P006)."""

from __future__ import annotations

from flightdeck.memory.architecture import ModelShape
from flightdeck.preflight.rule_result import RuleResult, correction, error
from flightdeck.recipe.schema import Recipe

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
    """P002: one process over several GPUs must train with n_gpu = 1 (no DataParallel, no n_gpu x batch).

    What transformers 5 does itself: the Trainer sets `_n_gpu = 1` when the loaded model's
    `hf_device_map` spans more than one GPU (from_pretrained sets that map only when the resolved map has
    more than one device), and `_wrap_model` never wraps a 4/8-bit model in DataParallel. A map that
    resolves to a single GPU leaves n_gpu at the visible GPU count: batch x n_gpu, and DataParallel around a
    non-quantised model.
    """
    model = recipe.model
    if model is None or model.device_map is None or recipe.resources.gpus_per_node < 2:
        return []
    quantised = model.quantization is not None
    wrap = (
        "a 4/8-bit model is never wrapped in DataParallel, but"
        if quantised
        else "the Trainer would wrap the model in DataParallel (dtype mismatch at lm_head) and"
    )
    return [
        correction(
            "P002",
            "model.device_map",
            f"device_map '{model.device_map}' runs one process over {recipe.resources.gpus_per_node} GPUs. "
            "transformers sets n_gpu = 1 itself only when the loaded model's device map spans several GPUs; "
            "when it resolves to one GPU ('sequential' with a model that fits on the first) n_gpu stays at the "
            f"number of visible GPUs: {wrap} the batch is multiplied by that count (fewer steps per epoch than "
            "planned).",
            "the trainer sets training_args._n_gpu = 1 before the Trainer is built, and stops at step 0 if "
            "the model is still wrapped in DataParallel or the planned steps differ",
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
