"""Model set-up: load (dtype, 4/8-bit, device map), freeze, add the adapter, re-enable its parameters.

The order is the R1 fix: freeze patterns apply to the base model before the adapter is added; afterwards
every adapter parameter is made trainable again, unless a freeze pattern names the adapter itself (it
matches the adapter's parameter name but not the weight it adapts, e.g. 'lora_'), which G001 reports.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from service.recipe.schema import Recipe
from worker.train.health import adapted_weight_name, is_adapter_param

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class LoadedModel:
    """The model ready for the Trainer, its tokenizer, and the corrections made on the way."""

    model: Any
    tokenizer: Any
    fixes: list[tuple[str, str]] = field(default_factory=list)  # (code, what was changed)


def _device_map(recipe: Recipe, local_rank: int, use_cpu: bool) -> Any:
    if recipe.model.device_map is not None:
        return recipe.model.device_map
    if recipe.model.quantization is not None:
        # A quantised model cannot be moved after loading: place it on this rank's device (P006).
        return {"": "cpu" if use_cpu else local_rank}
    return None


def _quantization_config(recipe: Recipe) -> Any:
    from transformers import BitsAndBytesConfig

    dtype = _DTYPES[recipe.model.dtype]
    if recipe.model.quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def apply_freeze(model: Any, patterns: list[str]) -> int:
    """Freeze base parameters whose name matches a pattern; the count frozen."""
    compiled = [re.compile(p) for p in patterns]
    frozen = 0
    for name, param in model.named_parameters():
        if any(p.search(name) for p in compiled):
            param.requires_grad_(False)
            frozen += 1
    return frozen


def enable_adapter_params(model: Any, patterns: list[str]) -> int:
    """Make every adapter parameter trainable, except those a freeze pattern names directly; count enabled."""
    compiled = [re.compile(p) for p in patterns]
    enabled = 0
    for name, param in model.named_parameters():
        if not is_adapter_param(name):
            continue
        short, base = name.removeprefix("base_model.model."), adapted_weight_name(name)
        names_adapter = any(p.search(short) and not p.search(base) for p in compiled)
        param.requires_grad_(not names_adapter)
        enabled += 0 if names_adapter else 1
    return enabled


def _add_adapter(model: Any, recipe: Recipe) -> Any:
    from peft import LoraConfig, TaskType, get_peft_model

    spec = recipe.adapter
    assert spec is not None
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
        modules_to_save=spec.modules_to_save or None,
        task_type=TaskType.CAUSAL_LM if recipe.task == "causal_lm" else None,
    )
    return get_peft_model(model, config)


def merge_adapter_output(adapter_dir: Path, dtype: str) -> Path:
    """Base + saved adapter merged into full weights under `adapter_dir/merged` (for '@previous')."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = adapter_dir / "merged"
    base_path = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=_DTYPES[dtype])
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(target)
    AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(target)
    return target


def load_model(recipe: Recipe, model_path: str, *, local_rank: int, use_cpu: bool) -> LoadedModel:
    """Load and prepare the recipe's model from `model_path` (already resolved)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, set_seed

    spec = recipe.model
    fixes: list[tuple[str, str]] = []
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    kwargs: dict[str, Any] = {
        "dtype": _DTYPES[spec.dtype],
        "device_map": _device_map(recipe, local_rank, use_cpu),
    }
    if spec.quantization:
        kwargs["quantization_config"] = _quantization_config(recipe)
    if spec.device_map is not None and spec.max_memory:
        kwargs["max_memory"] = {int(k) if k.isdigit() else k: v for k, v in spec.max_memory.items()}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    factory = AutoModelForCausalLM if recipe.task == "causal_lm" else AutoModelForMaskedLM
    model = factory.from_pretrained(model_path, **kwargs)
    model.train()  # from_pretrained returns eval mode (dropout off) in transformers 5
    model.config.use_cache = spec.use_cache and not spec.gradient_checkpointing  # G008
    if tokenizer.pad_token is None:
        # Not eos: padding with eos teaches the model never to stop (G009).
        tokenizer.add_special_tokens({"pad_token": "<pad>"})
        model.resize_token_embeddings(len(tokenizer))
        fixes.append(("G009", "the tokenizer had no pad token; added '<pad>'"))
    apply_freeze(model, spec.freeze)
    if spec.quantization:
        from peft import prepare_model_for_kbit_training

        # Checkpointing is switched on by the Trainer arguments, non-reentrant (G004).
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if recipe.adapter is not None:
        set_seed(recipe.training.seed)  # before the adapter, or its initial weights differ per rank
        model = _add_adapter(model, recipe)
        enable_adapter_params(model, spec.freeze)
    elif spec.quantization:
        raise ValueError("a 4/8-bit model cannot be fully fine-tuned; add an adapter (QLoRA)")
    if spec.gradient_checkpointing:
        # Frozen embeddings give checkpointed blocks inputs without grad: adapters would get none (G007).
        model.enable_input_require_grads()
    return LoadedModel(model, tokenizer, fixes)
