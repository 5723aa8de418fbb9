"""Model set-up: load (dtype, 4/8-bit, device map), freeze, add the adapter, re-enable its parameters.

The order is the R1 fix: freeze patterns apply to the base model before the adapter is added; afterwards
every adapter parameter is made trainable again, unless a freeze pattern names the adapter itself (it
matches the adapter's parameter name but not the weight it adapts, e.g. 'lora_'), which G001 reports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flightdeck.recipe.model_parts import (
    model_type_of,
    peft_target_modules,
    resolve_freeze,
    skips_tower,
    task_mismatch,
    tower_modules,
    unresolved_parts,
)
from flightdeck.recipe.schema import Recipe
from flightdeck.worker.train.health import HealthEvent, HealthStop, adapted_weight_name, is_adapter_param
from flightdeck.worker.train.image_text import ImageTextProcessor
from flightdeck.worker.train.model_output import TolerantLoss, attach_tolerant_loss

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class LoadedModel:
    """The model ready for the Trainer, its tokenizer, and the corrections made on the way."""

    model: Any
    tokenizer: Any
    fixes: list[tuple[str | None, str]] = field(default_factory=list)  # (code, what was changed)
    processor: ImageTextProcessor | None = None  # vision_language: chat template + image processor
    tolerant_loss: TolerantLoss | None = None  # V006: its note says when it converted an output


def quantised_tower(modules: list[str], prefixes: tuple[str, ...]) -> HealthStop:
    """V005: after a 4/8-bit load, modules the skip list should have kept in full precision are quantised."""
    return HealthStop(
        HealthEvent(
            "V005",
            "fatal",
            f"{len(modules)} module(s) under {', '.join(prefixes)} were quantised despite "
            f"model.quantization_skip_modules (e.g. {', '.join(modules[:3])}): what the previous stage "
            "trained would be lost.",
            fix="name the tower's full module prefix (e.g. 'model.visual'), or the part 'vision_tower'",
            data={"modules": modules[:50]},
        )
    )


def _device_map(recipe: Recipe, local_rank: int, use_cpu: bool) -> Any:
    if recipe.model.device_map is not None:
        return recipe.model.device_map
    if recipe.model.quantization is not None:
        # A quantised model cannot be moved after loading: place it on this rank's device (P006).
        return {"": "cpu" if use_cpu else local_rank}
    return None


def quantization_skip_modules(recipe: Recipe, model_type: str | None) -> list[str] | None:
    """Modules kept out of 4/8-bit, part names resolved to full prefixes (V005); None: transformers' default."""
    skip = recipe.model.quantization_skip_modules
    if not skip:
        return None
    resolved: list[str] = []
    for name in skip:
        resolved += list(tower_modules(model_type)) if name == "vision_tower" else [name]
    # A skip list replaces transformers' default skips, which keep the output head in full precision.
    return list(dict.fromkeys([*resolved, "lm_head"]))


def _quantization_config(recipe: Recipe, model_type: str | None) -> Any:
    from transformers import BitsAndBytesConfig

    dtype = _DTYPES[recipe.model.dtype]
    skip = quantization_skip_modules(recipe, model_type)
    if recipe.model.quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
            llm_int8_skip_modules=skip,
        )
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)


def quantised_modules(model: Any, prefixes: tuple[str, ...]) -> list[str]:
    """Names of 4/8-bit linears under `prefixes`: what V005 verifies after load."""
    found = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind in ("Linear4bit", "Linear8bitLt") and any(name.startswith(p + ".") for p in prefixes):
            found.append(name)
    return found


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


def _add_adapter(
    model: Any, recipe: Recipe, model_type: str | None, *, extra_modules_to_save: list[str] = ()
) -> Any:
    from peft import LoraConfig, TaskType, get_peft_model

    spec = recipe.adapter
    assert spec is not None
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=peft_target_modules(spec.target_modules, model_type),
        modules_to_save=list(dict.fromkeys([*spec.modules_to_save, *extra_modules_to_save])) or None,
        task_type=TaskType.CAUSAL_LM if recipe.task == "causal_lm" else None,
    )
    return get_peft_model(model, config)


def reusable_pad_token(tokenizer: Any) -> str | None:
    """A special token the tokenizer already has that can pad (G009): never EOS, or padding teaches the
    model never to stop; an existing token adds no embedding row an adapter would lose on reload (G011)."""
    eos = tokenizer.eos_token
    for candidate in (
        tokenizer.unk_token,
        tokenizer.bos_token,
        *getattr(tokenizer, "all_special_tokens", []),
    ):
        if candidate and candidate != eos:
            return str(candidate)
    return None


# G011: what an adapter trains and saves when a new pad token grows the vocabulary.
PAD_TOKEN_MODULES = ("embed_tokens", "lm_head")


def ensure_pad_token(
    tokenizer: Any, model: Any, *, adapter: bool, listed: Sequence[str] = ()
) -> tuple[tuple[str, str], list[str]]:
    """Give the tokenizer a pad token; (the fix record, modules an adapter must train and save).
    `listed`: the recipe's adapter.modules_to_save (host preflight writes these modules into it)."""
    reuse = reusable_pad_token(tokenizer)
    if reuse is not None:
        tokenizer.pad_token = reuse
        return ("G009", f"the tokenizer had no pad token; it pads with its existing {reuse!r}"), []
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    model.resize_token_embeddings(len(tokenizer))
    if not adapter:
        return ("G009", "the tokenizer had no pad token nor a spare special token; added '<pad>'"), []
    # A LoRA adapter saves no embedding rows: the new one would be lost on reload (peft#1457).
    saved = list(PAD_TOKEN_MODULES)
    missing = [m for m in saved if m not in listed]
    where = (
        "as the effective recipe's adapter.modules_to_save says"
        if not missing
        else f"added to adapter.modules_to_save here (the recipe did not list {', '.join(missing)})"
    )
    return (
        "G011",
        "the tokenizer had no pad token nor a spare special token; added '<pad>' and, since an adapter "
        f"trains, embed_tokens and lm_head are trained and saved with it ({where}) so the new row survives "
        "a reload",
    ), saved


def upcast_trainable(model: Any) -> int:
    """X003: fp16 AMP cannot unscale gradients of float16 parameters ('Attempting to unscale FP16
    gradients'): every trainable half-precision parameter (a modules_to_save copy of an fp16 head, say)
    is stored in float32; autocast still computes in fp16. The count changed."""
    changed = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
            changed += 1
    return changed


def model_factory(task: str) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForMaskedLM

    return {
        "causal_lm": AutoModelForCausalLM,
        "masked_lm": AutoModelForMaskedLM,
        "vision_language": AutoModelForImageTextToText,
    }[task]


def merge_adapter_output(adapter_dir: Path, dtype: str, task: str) -> Path:
    """Base + saved adapter merged into full weights under `adapter_dir/merged` (for '@previous')."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    target = adapter_dir / "merged"
    base_path = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = model_factory(task).from_pretrained(base_path, dtype=_DTYPES[dtype])
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(target)
    AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(target)
    if task == "vision_language":
        from transformers import AutoImageProcessor

        AutoImageProcessor.from_pretrained(adapter_dir).save_pretrained(target)
    return target


def load_model(recipe: Recipe, model_path: str, *, local_rank: int, use_cpu: bool) -> LoadedModel:
    """Load and prepare the recipe's model from `model_path` (already resolved)."""
    from transformers import AutoConfig, AutoTokenizer, set_seed

    spec = recipe.model
    fixes: list[tuple[str | None, str]] = []
    config = AutoConfig.from_pretrained(model_path).to_dict()
    model_type = model_type_of(config)
    problem = task_mismatch(recipe.task, config)
    if problem:
        raise ValueError(f"task: {problem}")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    processor = None
    if recipe.task == "vision_language":
        image_kwargs = {"max_pixels": recipe.data.max_pixels} if recipe.data.max_pixels else {}
        processor = ImageTextProcessor.from_pretrained(model_path, **image_kwargs)
        tokenizer = processor.tokenizer
    kwargs: dict[str, Any] = {
        "dtype": _DTYPES[spec.dtype],
        "device_map": _device_map(recipe, local_rank, use_cpu),
    }
    if spec.quantization:
        kwargs["quantization_config"] = _quantization_config(recipe, model_type)
    if spec.device_map is not None and spec.max_memory:
        kwargs["max_memory"] = {int(k) if k.isdigit() else k: v for k, v in spec.max_memory.items()}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    model = model_factory(recipe.task).from_pretrained(model_path, **kwargs)
    if spec.quantization and skips_tower(spec.quantization_skip_modules, model_type):
        tower = tower_modules(model_type)
        still = quantised_modules(model, tower)
        if still:
            # The skip list did not take (a short name, a renamed module): stage 1's training would be lost.
            raise quantised_tower(still, tower)
    model.train()  # from_pretrained returns eval mode (dropout off) in transformers 5
    use_cache = spec.use_cache and not spec.gradient_checkpointing  # G008
    model.config.use_cache = use_cache
    model.config.get_text_config().use_cache = use_cache  # vision-language models read the text config
    save_with_adapter: list[str] = []
    if tokenizer.pad_token is None:
        listed = recipe.adapter.modules_to_save if recipe.adapter is not None else []
        fix, save_with_adapter = ensure_pad_token(
            tokenizer, model, adapter=recipe.adapter is not None, listed=listed
        )
        fixes.append(fix)
    freeze = resolve_freeze(spec.freeze, model_type)
    missing_parts = unresolved_parts(spec.freeze, model_type)
    if missing_parts:
        raise ValueError(f"model.freeze names {missing_parts}, which a {model_type} model does not have")
    if freeze != spec.freeze:
        fixes.append((None, f"freeze parts resolved for {model_type}: {', '.join(freeze)}"))
    apply_freeze(model, freeze)
    if spec.quantization:
        from peft import prepare_model_for_kbit_training

        # Checkpointing is switched on by the Trainer arguments, non-reentrant (G004).
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if recipe.adapter is not None:
        set_seed(recipe.training.seed)  # before the adapter, or its initial weights differ per rank
        model = _add_adapter(model, recipe, model_type, extra_modules_to_save=save_with_adapter)
        enable_adapter_params(model, freeze)
    elif spec.quantization:
        raise ValueError("a 4/8-bit model cannot be fully fine-tuned; add an adapter (QLoRA)")
    if recipe.training.precision == "fp16":
        upcast_trainable(model)  # X003
    if spec.gradient_checkpointing:
        # Frozen embeddings give checkpointed blocks inputs without grad: adapters would get none (G007).
        model.enable_input_require_grads()
    tolerant_loss = attach_tolerant_loss(model)  # V006
    return LoadedModel(model, tokenizer, fixes, processor, tolerant_loss)
