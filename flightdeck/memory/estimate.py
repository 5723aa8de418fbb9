"""Peak GPU memory per device for a recipe, as a breakdown, from the model's shape alone.

Assumptions the numbers rest on (each printed in the estimate's `assumptions`):
- LoRA adapters are kept in float32 (PEFT casts adapters up for half-precision bases).
- 4/8-bit bases: block linears quantised, everything else float32 (prepare_model_for_kbit_training).
- Activations are counted per token and layer from what autograd saves in a transformers block
  (the Korthikanti et al. 2022 accounting, specialised to gated-MLP decoders and frozen bases).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from flightdeck.memory.architecture import ModelShape, lora_parameters, targeted_linears
from flightdeck.recipe.model_parts import PARTS
from flightdeck.recipe.schema import Recipe

GB = 1e9
# CUDA context, cuBLAS workspaces and allocator slack (R4's "framework overhead").
FRAMEWORK_OVERHEAD = 0.5 * GB
# NF4 stores 4 bits per weight plus blockwise constants: ~0.127 bit/param with double quantisation.
NF4_BYTES = 0.5 + 0.127 / 8
INT8_BYTES = 1.0
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Optimizer state per trainable parameter, as a multiple of its own bytes (Adam: two moments).
ADAM_STATES = 2


class MemoryEstimate(BaseModel):
    """Peak memory on the busiest GPU, in bytes, with the parts it is made of."""

    weights: float
    adapter: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    total: float
    parameters: int
    trainable_parameters: int
    tokens_per_micro_batch: int
    gpus_sharing_model: int = 1
    assumptions: list[str] = Field(default_factory=list)

    def table(self) -> str:
        """One line per part in GB, for messages and the bench script."""
        parts = ("weights", "adapter", "gradients", "optimizer", "activations", "overhead", "total")
        return ", ".join(f"{part} {getattr(self, part) / GB:.2f} GB" for part in parts)

    def summary(self) -> dict[str, Any]:
        """The breakdown in GB (rounded) plus counts, for JSON answers."""
        parts = ("weights", "adapter", "gradients", "optimizer", "activations", "overhead", "total")
        out: dict[str, Any] = {f"{part}_gb": round(getattr(self, part) / GB, 3) for part in parts}
        out |= {
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "tokens_per_micro_batch": self.tokens_per_micro_batch,
            "gpus_sharing_model": self.gpus_sharing_model,
            "assumptions": self.assumptions,
        }
        return out


def missing_for_estimate(recipe: Recipe) -> list[str]:
    """The recipe parts the estimate needs and a script job left out (empty for a recipe job)."""
    return [part for part in ("model", "data", "training") if getattr(recipe, part) is None]


def frozen_by_patterns(shape: ModelShape, patterns: list[str]) -> int:
    """How many parameters the recipe's freeze patterns (re.search over names) freeze."""
    compiled = [re.compile(p) for p in patterns]
    return sum(size for name, size in shape.parameter_sizes() if any(c.search(name) for c in compiled))


def _weight_bytes(shape: ModelShape, recipe: Recipe) -> tuple[float, float]:
    """(weights, largest temporary) in bytes: quantised bases dequantise one linear at a time."""
    quant = recipe.need_model().quantization
    if quant is None:
        return shape.total_parameters * DTYPE_BYTES[recipe.need_model().dtype], 0.0
    per_weight = NF4_BYTES if quant == "4bit" else INT8_BYTES
    rest = shape.total_parameters - shape.block_linear_parameters
    largest = max(linear.d_in * linear.d_out for linear in shape.block_linears)
    compute = PRECISION_BYTES[recipe.need_training().precision]
    return shape.block_linear_parameters * per_weight + rest * 4, float(largest * compute)


def _trainable(shape: ModelShape, recipe: Recipe) -> tuple[int, int, str]:
    """(adapter parameters, trainable base parameters, dtype of the trainable ones)."""
    if recipe.adapter is not None:
        adapter = lora_parameters(shape, recipe.adapter.target_modules, recipe.adapter.r)
        saved = 0
        for name in recipe.adapter.modules_to_save:
            # G011 (a pad token added under LoRA) writes embed_tokens and lm_head here; a dotted
            # name ("model.embed_tokens") counts the same.
            if name.rsplit(".", 1)[-1] in ("lm_head", "embed_tokens", "word_embeddings"):
                saved += shape.vocab * shape.hidden  # PEFT trains a full copy of the module
        return adapter + saved, 0, "float32"
    freeze = recipe.need_model().freeze
    tower = shape.extra_parameters  # the vision tower (and projector), not modelled layer by layer
    if "language_model" in freeze:
        # R2's stage 1: only the tower trains (its weights, gradients and optimizer state count).
        trainable = 0 if "vision_tower" in freeze else tower
    else:
        patterns = [p for p in freeze if p not in PARTS]
        trainable = shape.total_parameters - frozen_by_patterns(shape, patterns)
        trainable -= tower if "vision_tower" in freeze else 0
    return 0, max(trainable, 0), recipe.need_model().dtype


def _decoder_bytes_per_token_layer(shape: ModelShape, recipe: Recipe, sequence: int) -> float:
    """Bytes autograd keeps per token for one decoder block, without recomputation."""
    a = PRECISION_BYTES[recipe.need_training().precision]
    h, i = shape.hidden, shape.intermediate
    q_dim, kv_dim = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    saved = 2 * 4 * h  # two RMSNorms keep their float32 upcast input
    saved += a * (q_dim + 2 * kv_dim) + a * q_dim  # q, k, v after rotary + attention output
    saved += 3 * a * i  # gate, up, act(gate) for the gated MLP's backward
    if recipe.need_model().attn_implementation == "eager":
        saved += (4 + a) * shape.heads * sequence  # float32 softmax + its half-precision copy
    base_trains = recipe.adapter is None
    if base_trains:
        saved += 2 * a * h + a * i  # inputs of q/k/v, gate/up and down kept for weight gradients
    quantised = recipe.need_model().quantization is not None
    if quantised:
        # bitsandbytes' 4/8-bit matmuls keep their input for backward although the weight is frozen
        # (a bf16 linear with a frozen weight keeps none), and prepare_model_for_kbit_training keeps the
        # norms in float32, so the norm outputs they keep are float32: the attention norm's (shared by
        # q/k/v), the MLP norm's (gate/up), and down_proj's input. o_proj's is the attention output above.
        saved += 4 * h + 4 * h + a * i
    if recipe.adapter is not None:
        dropout = recipe.adapter.dropout > 0
        for linear in targeted_linears(shape, recipe.adapter.target_modules):
            # lora_A keeps its (dropped-out) input; dropout keeps a one-byte mask. Without dropout a
            # quantised layer's lora_A keeps the very tensor its 4-bit matmul already keeps.
            kept = a * linear.d_in if dropout or not quantised else 0
            saved += kept + (linear.d_in if dropout else 0) + a * recipe.adapter.r
    return float(saved)


def _encoder_bytes_per_token_layer(shape: ModelShape, recipe: Recipe, sequence: int) -> float:
    """Korthikanti et al.: s*b*h*(34 + 5*a*s/h) per layer; the score term only for eager attention."""
    h = shape.hidden
    scores = 5 * shape.heads * sequence / h if recipe.need_model().attn_implementation == "eager" else 0.0
    return h * (34 + scores) * PRECISION_BYTES[recipe.need_training().precision] / 2


def _activation_bytes(shape: ModelShape, recipe: Recipe) -> float:
    sequence = recipe.need_data().max_seq_length
    tokens = recipe.need_training().per_device_batch_size * sequence
    a = PRECISION_BYTES[recipe.need_training().precision]
    if shape.family == "decoder":
        per_layer = _decoder_bytes_per_token_layer(shape, recipe, sequence) * tokens
    else:
        per_layer = _encoder_bytes_per_token_layer(shape, recipe, sequence) * tokens
    if recipe.need_model().gradient_checkpointing:
        # Each block keeps only its input; one block at a time is recomputed in full.
        blocks = shape.layers * a * shape.hidden * tokens + per_layer
    else:
        blocks = shape.layers * per_layer
    # Logits in compute precision, their float32 upcast for the loss and its gradient.
    logits = tokens * shape.vocab * (a + 4 + 4)
    return blocks + logits


def estimate_memory(recipe: Recipe, shape: ModelShape) -> MemoryEstimate:
    """Peak bytes on the busiest GPU for `recipe` on a model of `shape`."""
    assumptions = list(shape.notes)
    weights, temporary = _weight_bytes(shape, recipe)
    adapter_params, base_trainable, trainable_dtype = _trainable(shape, recipe)
    trainable = adapter_params + base_trainable
    trainable_bytes = DTYPE_BYTES[trainable_dtype]
    adapter = float(adapter_params * trainable_bytes)
    gradients = float(trainable * trainable_bytes)
    if recipe.world_size > 1:
        gradients *= 2  # DDP's flat gradient buckets hold a second copy
        assumptions.append("DDP: gradient buckets double the gradient memory")
    optimizer_kind = recipe.need_training().optimizer
    if optimizer_kind == "adamw_torch":
        optimizer = float(trainable * trainable_bytes * ADAM_STATES)
    elif optimizer_kind in ("adamw_8bit", "paged_adamw_8bit"):
        optimizer = trainable * ADAM_STATES * 1.0
    else:
        optimizer = 0.0  # SGD without momentum; Adafactor's factored moments are negligible
        assumptions.append(f"{optimizer_kind}: optimizer state counted as negligible")
    activations = _activation_bytes(shape, recipe)
    share = recipe.resources.gpus_per_node if recipe.need_model().device_map is not None else 1
    if share > 1:
        # Model parallel: layers (and their activations) spread over the node's GPUs, logits on the last.
        logits = (
            recipe.need_training().per_device_batch_size
            * recipe.need_data().max_seq_length
            * shape.vocab
            * 10
        )
        weights, adapter, gradients, optimizer = (x / share for x in (weights, adapter, gradients, optimizer))
        activations = (activations - logits) / share + logits
        assumptions.append(f"device_map: model split evenly over {share} GPUs")
    if recipe.adapter is not None:
        assumptions.append("LoRA adapters kept in float32")
    if recipe.need_model().quantization:
        assumptions.append(f"{recipe.need_model().quantization}: non-quantised parameters upcast to float32")
    overhead = FRAMEWORK_OVERHEAD + temporary
    # `adapter` is part of the trainable set; weights exclude it so the parts add up.
    total = weights + adapter + gradients + optimizer + activations + overhead
    return MemoryEstimate(
        weights=weights,
        adapter=adapter,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        overhead=overhead,
        total=total,
        parameters=shape.total_parameters,
        trainable_parameters=trainable,
        tokens_per_micro_batch=recipe.need_training().per_device_batch_size
        * recipe.need_data().max_seq_length,
        gpus_sharing_model=share,
        assumptions=assumptions,
    )
