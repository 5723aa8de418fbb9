"""A model's shape from its config.json: layer sizes, parameter counts and module names, no torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flightdeck.recipe.model_parts import split_target

# Decoder families whose blocks are attention (q,k,v,o) + gated MLP (gate, up, down) + two norms.
GATED_DECODERS = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "olmo2", "granite", "phi3"}
)
ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "camembert"})
# Vision-language configs that nest the language model's fields under text_config (or keep them top-level).
VISION_LANGUAGE = {
    "qwen2_vl": "qwen2",
    "qwen2_5_vl": "qwen2",
    "qwen2_vl_text": "qwen2",  # transformers 5 nests Qwen2-VL's language model under this type
    "qwen2_5_vl_text": "qwen2",
    "llava": "llama",
    "mllama": "llama",
}


@dataclass(frozen=True)
class Linear:
    """One linear layer inside a block: its name relative to the block and its sizes."""

    name: str
    d_in: int
    d_out: int
    bias: bool = False

    @property
    def parameters(self) -> int:
        return self.d_in * self.d_out + (self.d_out if self.bias else 0)


@dataclass(frozen=True)
class ModelShape:
    """What the estimator and the static rules need to know about a model."""

    model_type: str
    family: str  # "decoder" or "encoder"
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int | None
    tied_embeddings: bool
    block_linears: tuple[Linear, ...]
    block_other_parameters: int  # norms, per block
    embedding_parameters: int  # token (+ position, type) embeddings and their norm
    head_parameters: int  # final norm + untied lm_head / MLM head
    extra_parameters: int = 0  # e.g. a vision tower we do not model layer by layer
    block_prefix: str = "model.layers"
    config_dtype: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def block_linear_parameters(self) -> int:
        return self.layers * sum(linear.parameters for linear in self.block_linears)

    @property
    def total_parameters(self) -> int:
        return (
            self.embedding_parameters
            + self.block_linear_parameters
            + self.layers * self.block_other_parameters
            + self.head_parameters
            + self.extra_parameters
        )

    def parameter_sizes(self) -> list[tuple[str, int]]:
        """Parameter names as transformers spells them, with sizes (norms left out), for freeze patterns."""
        if self.family == "encoder":
            sizes = [
                (
                    f"{self.block_prefix.split('.')[0]}.embeddings.word_embeddings.weight",
                    self.vocab * self.hidden,
                )
            ]
        else:
            sizes = [("model.embed_tokens.weight", self.vocab * self.hidden)]
        for index in range(self.layers):
            sizes += [
                (f"{self.block_prefix}.{index}.{linear.name}.weight", linear.parameters)
                for linear in self.block_linears
            ]
        if self.family == "decoder" and not self.tied_embeddings:
            sizes.append(("lm_head.weight", self.vocab * self.hidden))
        return sizes


def _get(config: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _text_config(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    model_type = str(config.get("model_type", ""))
    text = config.get("text_config")
    if isinstance(text, Mapping) and text.get("hidden_size"):
        inner = str(text.get("model_type") or VISION_LANGUAGE.get(model_type, model_type))
        return text, VISION_LANGUAGE.get(inner, inner)
    return config, VISION_LANGUAGE.get(model_type, model_type)


def _vision_parameters(config: Mapping[str, Any]) -> int:
    """ViT-style tower: depth x (4 e^2 attention + 2 e m MLP); patch embedding and merger ignored."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    width = _get(vision, "embed_dim", "hidden_size", default=0)
    depth = _get(vision, "depth", "num_hidden_layers", default=0)
    mlp = _get(vision, "intermediate_size", default=None) or int(width * _get(vision, "mlp_ratio", default=4))
    return int(depth) * (4 * int(width) ** 2 + 2 * int(width) * int(mlp))


def _decoder(config: Mapping[str, Any], model_type: str) -> ModelShape:
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(_get(config, "head_dim", default=hidden // heads))
    intermediate = int(config["intermediate_size"])
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    # Qwen2 hard-codes biases on q/k/v; llama-likes take attention_bias / mlp_bias from the config.
    qkv_bias = model_type == "qwen2" or bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    linears: tuple[Linear, ...]
    if model_type == "phi3":
        linears = (
            Linear("self_attn.qkv_proj", hidden, q_dim + 2 * kv_dim),
            Linear("self_attn.o_proj", q_dim, hidden),
            Linear("mlp.gate_up_proj", hidden, 2 * intermediate),
            Linear("mlp.down_proj", intermediate, hidden),
        )
    else:
        linears = (
            Linear("self_attn.q_proj", hidden, q_dim, qkv_bias),
            Linear("self_attn.k_proj", hidden, kv_dim, qkv_bias),
            Linear("self_attn.v_proj", hidden, kv_dim, qkv_bias),
            Linear("self_attn.o_proj", q_dim, hidden, bool(config.get("attention_bias", False))),
            Linear("mlp.gate_proj", hidden, intermediate, mlp_bias),
            Linear("mlp.up_proj", hidden, intermediate, mlp_bias),
            Linear("mlp.down_proj", intermediate, hidden, mlp_bias),
        )
    norms = {"gemma2": 4, "olmo2": 2}.get(model_type, 2) * hidden
    if model_type in ("qwen3", "olmo2"):
        norms += 2 * head_dim  # per-head q/k norms
    vocab = int(config["vocab_size"])
    tied = bool(config.get("tie_word_embeddings", model_type.startswith("gemma")))
    return ModelShape(
        model_type=model_type,
        family="decoder",
        hidden=hidden,
        intermediate=intermediate,
        layers=int(config["num_hidden_layers"]),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        max_positions=_get(config, "max_position_embeddings"),
        tied_embeddings=tied,
        block_linears=linears,
        block_other_parameters=norms,
        embedding_parameters=vocab * hidden,
        head_parameters=hidden + (0 if tied else vocab * hidden),
    )


def _encoder(config: Mapping[str, Any], model_type: str) -> ModelShape:
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    intermediate = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    positions = int(_get(config, "max_position_embeddings", default=512))
    linears = (
        Linear("attention.self.query", hidden, hidden, True),
        Linear("attention.self.key", hidden, hidden, True),
        Linear("attention.self.value", hidden, hidden, True),
        Linear("attention.output.dense", hidden, hidden, True),
        Linear("intermediate.dense", hidden, intermediate, True),
        Linear("output.dense", intermediate, hidden, True),
    )
    type_vocab = int(_get(config, "type_vocab_size", default=2))
    return ModelShape(
        model_type=model_type,
        family="encoder",
        hidden=hidden,
        intermediate=intermediate,
        layers=int(config["num_hidden_layers"]),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        vocab=vocab,
        max_positions=positions,
        tied_embeddings=True,
        block_linears=linears,
        block_other_parameters=4 * hidden,  # two LayerNorms, weight + bias
        embedding_parameters=(vocab + positions + type_vocab) * hidden + 2 * hidden,
        # Masked-LM head: transform dense + LayerNorm + decoder bias (decoder weight tied).
        head_parameters=hidden * hidden + hidden + 2 * hidden + vocab,
        block_prefix=f"{model_type.replace('-', '_')}.encoder.layer",
    )


def model_shape(config: Mapping[str, Any]) -> ModelShape | None:
    """The shape of a known architecture from its config.json, or None when we cannot model it."""
    text, model_type = _text_config(config)
    dtype = _get(config, "torch_dtype", "dtype") or _get(text, "torch_dtype", "dtype")
    try:
        if model_type in GATED_DECODERS:
            shape = _decoder(text, model_type)
        elif model_type in ENCODERS:
            shape = _encoder(text, model_type)
        else:
            return None
    except (KeyError, TypeError, ValueError):
        return None
    vision = _vision_parameters(config)
    notes = ("vision tower counted approximately from vision_config",) if vision else ()
    return replace(shape, extra_parameters=vision, config_dtype=str(dtype) if dtype else None, notes=notes)


def matches_target(module_name: str, target: str) -> bool:
    """PEFT's rule for a target_modules entry: the full name, or its last dotted components."""
    return module_name == target or module_name.endswith("." + target)


def targeted_linears(shape: ModelShape, targets: list[str] | str) -> list[Linear]:
    """The block linears a LoRA target list selects ('all-linear': every linear in the blocks)."""
    if targets == "all-linear":
        return list(shape.block_linears)
    # The blocks modelled are the language model's: a target within another part adapts none of them.
    names = [name for part, name in map(split_target, targets) if part in (None, "language_model")]
    return [linear for linear in shape.block_linears if any(matches_target(linear.name, t) for t in names)]


def lora_parameters(shape: ModelShape, targets: list[str] | str, rank: int) -> int:
    """Sum over targeted linears of r x (d_in + d_out), for every block."""
    per_block = sum(rank * (linear.d_in + linear.d_out) for linear in targeted_linears(shape, targets))
    return shape.layers * per_block
