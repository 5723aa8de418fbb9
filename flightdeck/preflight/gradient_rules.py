"""Static rules about what trains and how gradients flow (G001, G004, G005, G007, G008, G010, X003)."""

from __future__ import annotations

import difflib
import re

from flightdeck.memory.architecture import ModelShape, targeted_linears
from flightdeck.preflight.rule_result import RuleResult, correction, error
from flightdeck.recipe.schema import Recipe

# Where llama-style names put common target modules, for recipes whose model config is not known.
GENERIC_PARENTS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
GENERIC_NAMES = (
    "model.embed_tokens.weight",
    *(f"model.layers.0.{parent}.{name}.weight" for name, parent in GENERIC_PARENTS.items()),
    "model.norm.weight",
    "lm_head.weight",
)
# Without a config, "freezes everything" must hold for every layer a model might have, or a recipe
# that keeps one layer trainable (R2's stage 1: "^(?!model\.layers\.1\.)") is refused wrongly.
PROBE_LAYERS = 128
GENERIC_ALL_LAYERS = (
    *GENERIC_NAMES,
    *(
        f"model.layers.{layer}.{parent}.{name}.weight"
        for layer in range(1, PROBE_LAYERS)
        for name, parent in GENERIC_PARENTS.items()
    ),
)


def _target_parameters(recipe: Recipe, shape: ModelShape | None) -> list[tuple[str, str]]:
    """(the module of layer 0 as the user should read it, its weight to match freeze patterns against).

    Without the model's config the parameter is where llama-style models put the name; the module
    shown is the target as written, never a made-up path.
    """
    assert recipe.adapter is not None
    targets = recipe.adapter.target_modules
    if shape is not None:
        return [
            (f"{shape.block_prefix}.0.{linear.name}", f"{shape.block_prefix}.0.{linear.name}.weight")
            for linear in targeted_linears(shape, targets)
        ]
    if targets == "all-linear":
        return [(n.removesuffix(".weight"), n) for n in GENERIC_NAMES if ".layers." in n]
    return [
        (
            f"model.layers.0.{GENERIC_PARENTS[t]}.{t}" if t in GENERIC_PARENTS else t,
            f"model.layers.0.{GENERIC_PARENTS.get(t, 'block')}.{t}.weight",
        )
        for t in targets
    ]


def _unknown_target_hint(modules: list[str]) -> str:
    """For targets no llama-style model has (`qq_proj`): the close names, and where the real check is."""
    unknown = [m for m in modules if "." not in m and m not in GENERIC_PARENTS]
    hints = []
    for name in unknown:
        near = difflib.get_close_matches(name, list(GENERIC_PARENTS), n=3, cutoff=0.6)
        maybe = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
        hints.append(f"'{name}' is no module name of a llama-style model{maybe}")
    if not hints:
        return ""
    return f" {'; '.join(hints)}; the worker checks target names against the model itself (G006)."


def frozen_adapters(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """G001: freeze patterns that cover adapter targets, or everything when there is no adapter."""
    model = recipe.model
    if model is None:
        return []
    patterns = [re.compile(p) for p in model.freeze]
    if not patterns:
        return []
    if recipe.adapter is None:
        names = [name for name, _ in shape.parameter_sizes()] if shape else list(GENERIC_ALL_LAYERS)
        if all(any(p.search(name) for p in patterns) for name in names):
            return [
                error(
                    "G001",
                    "model.freeze",
                    "with adapter null the freeze patterns freeze every parameter: nothing would train. "
                    "Narrow model.freeze or add an adapter.",
                )
            ]
        return []
    targets = _target_parameters(recipe, shape)
    # The trainer re-enables adapters after freezing, except where a pattern names the adapter itself.
    naming_adapter = [
        p.pattern
        for p in patterns
        for _, name in targets
        if p.search(name.replace(".weight", ".lora_A.default.weight")) and not p.search(name)
    ]
    if naming_adapter:
        return [
            error(
                "G001",
                "model.freeze",
                f"freeze pattern '{naming_adapter[0]}' names the adapter's own parameters: nothing would "
                "train. Remove it (freeze patterns are for base weights).",
            )
        ]
    covered = [module for module, name in targets if any(p.search(name) for p in patterns)]
    if not covered:
        return []
    return [
        correction(
            "G001",
            "model.freeze",
            f"freeze patterns also match adapter targets ({', '.join(covered[:4])}); adapters on frozen "
            f"modules would inherit requires_grad=False and never train.{_unknown_target_hint(covered)}",
            "the trainer freezes before adding adapters, then re-enables every adapter parameter and stops "
            "at step 0 if nothing is trainable",
        )
    ]


def quantised_full_finetune(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """G010: 4/8-bit weights cannot be trained directly, only through an adapter."""
    model = recipe.model
    if model is None or model.quantization is None or recipe.adapter is not None:
        return []
    return [
        error(
            "G010",
            "model.quantization",
            f"a {model.quantization} base cannot be fully fine-tuned (quantised weights take no "
            "gradient). Add an adapter (QLoRA) or set quantization to null.",
        )
    ]


def reentrant_checkpointing(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """G004: reentrant checkpointing marks parameters ready twice under DDP + PEFT.

    In one process reentrant checkpointing trains (with input grads, G007), so an explicit request for
    it is kept there; under DDP it is corrected to non-reentrant.
    """
    model = recipe.model
    if model is None or not (model.gradient_checkpointing and model.gradient_checkpointing_reentrant):
        return []
    if recipe.world_size < 2:
        return []
    return [
        correction(
            "G004",
            "model.gradient_checkpointing_reentrant",
            f"reentrant gradient checkpointing under DDP ({recipe.world_size} processes) fails with adapters "
            "('Expected to mark a variable ready only once').",
            "non-reentrant checkpointing (use_reentrant=False)",
            {"model.gradient_checkpointing_reentrant": False},
        )
    ]


def unused_parameters_with_checkpointing(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """G005: find_unused_parameters and checkpointing together break DDP's reduction bookkeeping."""
    model, training = recipe.model, recipe.training
    if model is None or training is None:
        return []
    if not (training.ddp_find_unused_parameters and model.gradient_checkpointing):
        return []
    if recipe.world_size < 2:
        return []
    return [
        error(
            "G005",
            "training.ddp_find_unused_parameters",
            "ddp_find_unused_parameters with gradient checkpointing under DDP fails ('Expected to mark a "
            "variable ready only once' / 'Expected to have finished reduction'). Either freeze the "
            "modules outside the forward path and set ddp_find_unused_parameters false, or turn "
            "gradient_checkpointing off.",
        )
    ]


def checkpointing_without_input_grads(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """G007: adapters behind frozen embeddings get no gradient through reentrant checkpointed blocks.

    Only reentrant checkpointing loses them (non-reentrant checkpointing, the default and what G004
    sets under DDP, propagates gradients to parameters whatever the inputs), so this runs after G004 on
    the corrected recipe and speaks only when reentrant checkpointing is what will run.
    """
    model = recipe.model
    if model is None or recipe.adapter is None or not model.gradient_checkpointing:
        return []
    if not model.gradient_checkpointing_reentrant:
        return []
    if any(name in ("embed_tokens", "word_embeddings") for name in recipe.adapter.modules_to_save):
        return []  # trained embeddings give the blocks inputs that require grad
    return [
        correction(
            "G007",
            "model.gradient_checkpointing_reentrant",
            "reentrant gradient checkpointing with an adapter over frozen embeddings gives silent zero "
            "adapter gradients unless the inputs require grad (the checkpointed blocks' inputs do not).",
            "the trainer calls model.enable_input_require_grads() before training",
        )
    ]


def cache_with_checkpointing(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """G008: the KV cache is useless in training and incompatible with checkpointing."""
    model = recipe.model
    if model is None or not (model.use_cache and model.gradient_checkpointing):
        return []
    return [
        correction(
            "G008",
            "model.use_cache",
            "use_cache=True is incompatible with gradient checkpointing.",
            "use_cache set to false",
            {"model.use_cache": False},
        )
    ]


def half_precision_trainables(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """X003: fp16 AMP cannot unscale gradients of parameters stored in float16."""
    model, training = recipe.model, recipe.training
    if model is None or training is None or model.dtype != "float16" or training.precision != "fp16":
        return []
    if recipe.adapter is None:
        return [
            correction(
                "X003",
                "model.dtype",
                "full fine-tuning with weights in float16 and fp16 mixed precision fails ('Attempting to "
                "unscale FP16 gradients').",
                "weights loaded in float32 (fp16 autocast still computes in half precision)",
                {"model.dtype": "float32"},
            )
        ]
    return [
        correction(
            "X003",
            "adapter",
            "a float16 base with fp16 mixed precision needs trainable (adapter) parameters in float32, "
            "else 'Attempting to unscale FP16 gradients'.",
            "the trainer stores every trainable parameter in float32 (adapters and modules_to_save copies)",
        )
    ]


GRADIENT_RULES = (
    frozen_adapters,
    quantised_full_finetune,
    reentrant_checkpointing,
    unused_parameters_with_checkpointing,
    checkpointing_without_input_grads,
    cache_with_checkpointing,
    half_precision_trainables,
)
