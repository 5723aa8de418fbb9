"""The keys the recipe schema allows at a path, for a "did you mean" on a misspelt key (`learning_rat`)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from functools import cache
from typing import Any

from flightdeck.recipe.schema import Recipe


@cache
def _recipe_schema() -> dict[str, Any]:
    return Recipe.model_json_schema()


def _options(node: Any, defs: dict[str, Any]) -> list[dict[str, Any]]:
    """A schema node with its $ref followed and its anyOf/oneOf/allOf members spread out."""
    if not isinstance(node, dict):
        return []
    if "$ref" in node:
        return _options(defs.get(node["$ref"].rsplit("/", 1)[-1]), defs)
    members = [m for key in ("anyOf", "oneOf", "allOf") for m in node.get(key, [])]
    return [o for m in members for o in _options(m, defs)] if members else [node]


def allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys of the object at `loc` (pydantic's location of an unknown key, less the key itself)."""
    schema = _recipe_schema()
    defs = schema.get("$defs", {})
    nodes = _options(schema, defs)
    for part in loc:
        found = []
        for node in nodes:
            if isinstance(part, int):
                found += _options(node.get("items"), defs)
            elif part in node.get("properties", {}):
                found += _options(node["properties"][part], defs)
            elif isinstance(node.get("additionalProperties"), dict):
                found += _options(node["additionalProperties"], defs)
        nodes = found or nodes  # a union member's tag in the location is no key: stay where we are
    return sorted({key for node in nodes for key in node.get("properties", {})})


# The names users bring from transformers' TrainingArguments, peft's LoraConfig and TRL / Axolotl
# configs, by the section they belong in: too unlike the recipe's own names for a spelling match.
OTHER_TOOLS_NAMES: dict[str, dict[str, str]] = {
    # The recipe's top level: the sections as peft and TrainingArguments users name them.
    "": {
        "lora": "adapter",
        "lora_config": "adapter",
        "peft": "adapter",
        "peft_config": "adapter",
        "training_args": "training",
        "training_arguments": "training",
        "dataset": "data",
        "datasets": "data",
    },
    "training": {
        "lr": "learning_rate",
        "num_train_epochs": "epochs",
        "num_epochs": "epochs",
        "per_device_train_batch_size": "per_device_batch_size",
        "micro_batch_size": "per_device_batch_size",
        "batch_size": "per_device_batch_size",
        "lr_scheduler_type": "lr_scheduler",
        "optim": "optimizer",
        "bf16": "precision",
        "fp16": "precision",
        "mixed_precision": "precision",
        "gradient_clipping": "max_grad_norm",
        "warmup_steps": "warmup_ratio",
    },
    "adapter": {
        "lora_r": "r",
        "lora_alpha": "alpha",
        "lora_dropout": "dropout",
        "lora_target_modules": "target_modules",
    },
    "model": {
        "model_name_or_path": "path",
        "base_model": "path",
        "torch_dtype": "dtype",
        "load_in_4bit": "quantization",
        "load_in_8bit": "quantization",
    },
    "data": {
        "max_length": "max_seq_length",
        "sequence_len": "max_seq_length",
        "dataloader_num_workers": "num_workers",
    },
    "resources": {
        "nproc_per_node": "gpus_per_node",
        "num_gpus": "gpus_per_node",
        "nnodes": "nodes",
        "num_nodes": "nodes",
    },
}


# Of those, the ones whose value does not carry over as it is: renaming `warmup_steps: 100` would give
# `warmup_ratio: 100` (a fraction of the run, below 1), `bf16: true` would give `precision: true`.
NOT_A_RENAME: dict[str, str] = {
    "warmup_steps": "set 'warmup_ratio' to the fraction of the run's steps to warm up over (warmup_steps "
    "100 of max_steps 1000 is 0.1), and remove 'warmup_steps'",
    "bf16": 'replace it with "precision": "bf16" where it was true; remove it where it was false',
    "fp16": 'replace it with "precision": "fp16" where it was true; remove it where it was false',
    "mixed_precision": 'replace it with "precision": one of "bf16", "fp16" or "fp32"',
    "load_in_4bit": 'replace it with "quantization": "4bit" (remove it where it was false)',
    "load_in_8bit": 'replace it with "quantization": "8bit" (remove it where it was false)',
    # Axolotl's list of sources (each with `path` and `type`), or one dataset's name: `data` holds sources
    # in `train` (and `eval`), each a `path` and its format's `preset`.
    "datasets": 'give its sources as "data": {"train": [{"path": ..., "preset": ...}]}, and remove it',
    "dataset": 'give its sources as "data": {"train": [{"path": ..., "preset": ...}]}, and remove it',
}


def home_section(key: str, sections: Iterable[str]) -> tuple[str, str] | None:
    """The section an unknown top-level `key` belongs in, and its name there, when it is one of that
    section's keys as the recipe or another tool names it. A flat config (Axolotl's, a YAML of
    TrainingArguments) puts `learning_rate`, `lora_r` or `base_model` at the top; "remove it" would lose
    the setting, and a spelling match would take `learning_rate` for the `training` section itself."""
    for section in sections:
        allowed = allowed_keys((section,))
        name = key if key in allowed else OTHER_TOOLS_NAMES.get(section, {}).get(key.lower())
        if name in allowed:
            return section, name
    return None


def move_fix(key: str, section: str, name: str) -> str:
    """The fix for `key` given at the top level that belongs in `section` as `name`."""
    if key.lower() in NOT_A_RENAME:
        return f"in '{section}': {NOT_A_RENAME[key.lower()]}"
    return f"move '{key}' into '{section}'" + ("" if name == key else f" as '{name}'")


def rename_fix(key: str, near: str) -> str:
    """The fix for an unknown `key` whose recipe name is `near`: a rename, unless the value changes too."""
    return NOT_A_RENAME.get(key.lower()) or f"rename '{key}' to '{near}'"


def did_you_mean(loc: tuple[int | str, ...]) -> str | None:
    """The allowed key closest to the unknown one at the end of `loc`, if any is close: its spelling, or
    what another tool calls it (`num_train_epochs` is `epochs` here)."""
    if not loc or not isinstance(loc[-1], str):
        return None
    allowed = allowed_keys(loc[:-1])
    section = loc[-2] if len(loc) >= 2 and isinstance(loc[-2], str) else None
    alias = OTHER_TOOLS_NAMES.get(section or "", {}).get(loc[-1].lower())
    if alias in allowed:
        return alias
    near = difflib.get_close_matches(loc[-1], allowed, n=1, cutoff=0.6)
    return near[0] if near else None
