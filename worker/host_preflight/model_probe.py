"""The model as the host sees it: config.json, module names built on the meta device, the tokenizer.

Host rules G006 (target modules exist), D006 (sequence vs positions), X002 (fp16 on a bf16 model) and
G009 (pad token). No weights are read: the model is instantiated on torch's meta device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.memory.architecture import matches_target
from service.preflight.outcome import Outcome, correction, error, warn
from service.recipe.schema import PREVIOUS_STAGE, Recipe

# Output heads are not adapter targets; PEFT's 'all-linear' leaves them out too.
HEAD_NAMES = ("lm_head", "cls.predictions.decoder", "score", "classifier")


@dataclass
class ModelProbe:
    """What the meta-device model tells us: config, linear module names, parameter count, tokenizer."""

    directory: Path
    config: dict[str, Any]
    linear_names: list[str] = field(default_factory=list)
    parameter_count: int = 0
    pad_token: str | None = None
    tokenizer: Any = None


def resolve_model_dir(recipe: Recipe, workspace: Path) -> Path | str:
    """A local directory (relative paths resolve against the workspace) or the hub id as given."""
    path = Path(recipe.model.path)
    local = path if path.is_absolute() else workspace / path
    return local if local.is_dir() else recipe.model.path


def build_on_meta(config: Any, task: str) -> Any:
    """Instantiate the architecture with no storage (every tensor on the meta device)."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    factory = AutoModelForCausalLM if task == "causal_lm" else AutoModelForMaskedLM
    with torch.device("meta"):
        try:
            return factory.from_config(config)  # type: ignore[no-untyped-call]
        except ValueError:  # e.g. a vision-language config with no causal-LM mapping
            return AutoModel.from_config(config)  # type: ignore[no-untyped-call]


def probe_model(recipe: Recipe, workspace: Path) -> ModelProbe:
    """Read config.json and the tokenizer, and list linear modules of the meta-device model."""
    import torch
    from transformers import AutoConfig, AutoTokenizer
    from transformers.pytorch_utils import Conv1D

    location = resolve_model_dir(recipe, workspace)
    config = AutoConfig.from_pretrained(location)
    model = build_on_meta(config, recipe.task)
    linear_names = [
        name for name, module in model.named_modules() if isinstance(module, (torch.nn.Linear, Conv1D))
    ]
    count = sum(p.numel() for p in model.parameters())
    raw = Path(location) / "config.json"
    config_dict = json.loads(raw.read_text()) if raw.is_file() else config.to_dict()
    tokenizer = AutoTokenizer.from_pretrained(location)
    return ModelProbe(
        directory=Path(location),
        config=config_dict,
        linear_names=linear_names,
        parameter_count=count,
        pad_token=tokenizer.pad_token,
        tokenizer=tokenizer,
    )


def candidate_targets(linear_names: list[str]) -> list[str]:
    """Short names usable in target_modules (the last component of each non-head linear)."""
    names = {name.rsplit(".", 1)[-1] for name in linear_names if not name.endswith(HEAD_NAMES)}
    return sorted(names)


def missing_targets(recipe: Recipe, probe: ModelProbe) -> list[Outcome]:
    """G006: target_modules that match no linear module of the model."""
    if recipe.adapter is None or recipe.adapter.target_modules == "all-linear":
        return []
    missing = [
        t for t in recipe.adapter.target_modules if not any(matches_target(n, t) for n in probe.linear_names)
    ]
    if not missing:
        return []
    return [
        error(
            "G006",
            "adapter.target_modules",
            f"target modules {missing} not found in the model ('Target modules ... not found in the base "
            f"model'); its linear modules are: {', '.join(candidate_targets(probe.linear_names))}. "
            "Use those names or 'all-linear'.",
            "host",
        )
    ]


def _position_limit(config: dict[str, Any]) -> int | None:
    text = config.get("text_config")
    source = text if isinstance(text, dict) and text.get("max_position_embeddings") else config
    limit = source.get("max_position_embeddings") or source.get("n_positions")
    return int(limit) if limit else None


def sequence_beyond_positions(recipe: Recipe, probe: ModelProbe) -> list[Outcome]:
    """D006: max_seq_length beyond the model's position table; capped, and recorded."""
    limit = _position_limit(probe.config)
    if limit is None or recipe.data.max_seq_length <= limit:
        return []
    return [
        correction(
            "D006",
            "data.max_seq_length",
            f"max_seq_length {recipe.data.max_seq_length} exceeds the model's "
            f"max_position_embeddings {limit}.",
            f"max_seq_length capped at {limit}",
            {"data.max_seq_length": limit},
            "host",
        )
    ]


def fp16_on_bf16_model(recipe: Recipe, probe: ModelProbe) -> list[Outcome]:
    """X002: fp16 training of a model pretrained in bf16 overflows (NaN or zero loss)."""
    dtype = probe.config.get("torch_dtype") or probe.config.get("dtype")
    if recipe.training.precision != "fp16" or dtype != "bfloat16":
        return []
    return [
        warn(
            "X002",
            "training.precision",
            "the model was saved in bfloat16 and training uses fp16: activations may overflow (NaN or zero "
            "loss). Use precision 'bf16' on Ampere or newer GPUs, or 'fp32'.",
            "host",
        )
    ]


def missing_pad_token(recipe: Recipe, probe: ModelProbe) -> list[Outcome]:
    """G009: a tokenizer without a pad token cannot pad batches."""
    if probe.pad_token is not None or recipe.model.path == PREVIOUS_STAGE:
        return []
    return [
        correction(
            "G009",
            "model.path",
            "the tokenizer has no pad token ('Asking to pad but the tokenizer does not have a "
            "padding token').",
            "the trainer adds a '<pad>' token and resizes the embeddings (not eos: the model must "
            "learn to stop)",
            where="host",
        )
    ]


MODEL_RULES = (missing_targets, sequence_beyond_positions, fp16_on_bf16_model, missing_pad_token)
