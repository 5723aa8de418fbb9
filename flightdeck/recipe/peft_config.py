"""peft's saved `adapter_config.json` given as a recipe's `adapter`: one finding with the adapter it
stands for, in place of one "unknown key" per field peft writes (41 in peft 0.21, nearly all defaults)."""

from __future__ import annotations

import json
from typing import Any, TypeGuard

from flightdeck.recipe.findings import Finding
from flightdeck.recipe.near_keys import OWN_SCRIPT, recipe_key
from flightdeck.recipe.schema import AdapterSpec

# What a saved config records about itself or the run it came from, not how to train.
_RECORDS = {
    "peft_type",
    "task_type",
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
    "auto_mapping",
}
# Settings whose default is not "off" (None, false, {} or []): the value that changes nothing.
_DEFAULTS: dict[str, Any] = {
    "bias": "none",
    "init_lora_weights": True,
    "megatron_core": "megatron.core",
    "qalora_group_size": 16,
}


def is_peft_config(adapter: Any) -> TypeGuard[dict[str, Any]]:
    """An object peft's `save_pretrained` wrote: it always records `peft_type`."""
    return isinstance(adapter, dict) and "peft_type" in adapter


def peft_config_finding(path: str, config: dict[str, Any]) -> Finding:
    """The finding for `config` given at `path`: the recipe's adapter with its values as the fix, and
    the settings of it that the recipe's LoRA does not have (a run would train without them)."""
    kind = config.get("peft_type")
    if str(kind).upper() != "LORA":
        return Finding(
            path=path,
            message=f"this is peft's saved adapter_config.json for peft_type {kind!r}; Flightdeck trains LoRA "
            "adapters",
            fix='give LoRA\'s settings as "adapter": {"r": ..., "alpha": ..., "target_modules": [...]}, or '
            + OWN_SCRIPT,
        )
    # What the recipe's adapter sets, by peft's names (`lora_alpha` is `alpha`): near_keys knows them.
    given = {recipe_key("adapter", key): value for key, value in config.items() if value not in (None, [])}
    ours = {name: given[name] for name in AdapterSpec.model_fields if name in given}  # in the recipe's order
    # peft also takes a regular expression over module names ("q_proj|v_proj"); the recipe takes names.
    pattern = ours.get("target_modules")
    if isinstance(pattern, str) and pattern != "all-linear":
        ours["target_modules"] = ["..."]
    elif isinstance(pattern, list):  # peft keeps a set: its order in the file is the hash's, not the user's
        ours["target_modules"] = sorted(pattern, key=str)
    unsupported = sorted(
        key
        for key, value in config.items()
        if recipe_key("adapter", key) is None and key not in _RECORDS
        if value != _DEFAULTS.get(key) and value not in (None, False, {}, [])
    )
    message = (
        "this is peft's saved adapter_config.json (a LoraConfig); the recipe's adapter takes its settings"
    )
    message += " by the recipe's names"
    if unsupported:
        settings = ", ".join(f"{key} {json.dumps(config[key])}" for key in unsupported)
        message += f"; these of its settings have no place in the recipe and would not apply: {settings}"
    if ours.get("target_modules") == ["..."]:
        message += f"; its target_modules {pattern!r} is a pattern: list the module names it matches"
    return Finding(path=path, message=message, fix=f'give it as "adapter": {json.dumps(ours)}')
