"""The keys the recipe schema allows at a path, for a "did you mean" on a misspelt key (`learning_rat`)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from functools import cache
from typing import Any

from flightdeck.recipe.schema import AdapterSpec, Recipe


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


def _nodes_at(loc: tuple[int | str, ...]) -> list[dict[str, Any]]:
    """The schema's options for the value at `loc` (pydantic's location)."""
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
    return nodes


def allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys of the object at `loc` (pydantic's location of an unknown key, less the key itself)."""
    return sorted({key for node in _nodes_at(loc) for key in node.get("properties", {})})


def _shape(kind: Any) -> str:
    return kind if kind in ("object", "array", "null") else "scalar"


def _shape_of(value: Any) -> str:
    kinds = {dict: "object", list: "array", type(None): "null"}
    return kinds.get(type(value), "scalar")


def takes(loc: tuple[int | str, ...], value: Any) -> bool:
    """Whether the key at `loc` can hold `value`'s shape: an object, a list, null or a scalar. Only the
    shape, since the recipe takes "10" for 10 (a YAML writer's 1e-4 arrives as a string); a scalar given
    where an object goes (`train_on_inputs: false` for the `training` section) is no misspelling of it."""
    kinds = [node.get("type") for node in _nodes_at(loc)]
    return any(kind is None or _shape(kind) == _shape_of(value) for kind in kinds)


_AXOLOTL_SOURCE = {"type": "preset", "ds_type": "format"}

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
        # TRL's script arguments (`trl sft --config`): the dataset as a Hub id, its text column, LoRA on.
        "dataset_name": "data",
        "dataset_text_field": "data",
        "use_peft": "adapter",
        # LLaMA-Factory's: lora, full or freeze.
        "finetuning_type": "adapter",
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
        # LLaMA-Factory's names.
        "lora_rank": "r",
        "lora_target": "target_modules",
    },
    "model": {
        "model_name_or_path": "path",
        "base_model": "path",
        "torch_dtype": "dtype",
        "load_in_4bit": "quantization",
        "load_in_8bit": "quantization",
        "quantization_bit": "quantization",  # LLaMA-Factory's 4 or 8
    },
    "data": {
        "max_length": "max_seq_length",
        "sequence_len": "max_seq_length",
        "max_seq_len": "max_seq_length",
        "cutoff_len": "max_seq_length",  # LLaMA-Factory's
        "block_size": "max_seq_length",  # run_clm's
        "dataloader_num_workers": "num_workers",
    },
    "resources": {
        "nproc_per_node": "gpus_per_node",
        "num_gpus": "gpus_per_node",
        "nnodes": "nodes",
        "num_nodes": "nodes",
    },
    # A data source as an entry of Axolotl's `datasets` (`type: alpaca`, `ds_type: json`).
    "data.train[]": _AXOLOTL_SOURCE,
    "data.eval[]": _AXOLOTL_SOURCE,
}


# Where a fix sends what the recipe does not train (another PEFT method, plain text under causal_lm).
OWN_SCRIPT = "run your own script as a script job (docs/own-script.md)"

_SOURCES_FIX = (
    'give its sources as "data": {"train": [{"path": ..., "preset": ...}]} (Axolotl\'s "type" is the '
    '"preset"), and remove it'
)

# Other tools' values for a recipe key that takes a fixed set of them: the recipe's value for the same
# thing, and what it is. Asked for a value the key does not take, or a renamed key's value.
OTHER_TOOLS_VALUES: dict[str, dict[str, tuple[str, str]]] = {
    "optimizer": {
        # transformers' OptimizerNames, as TrainingArguments, Axolotl and LLaMA-Factory take them.
        "adamw_torch_fused": ("adamw_torch", "the same AdamW update"),
        "adamw_hf": ("adamw_torch", "the same AdamW update"),
        "adamw": ("adamw_torch", "the same AdamW update"),
        "adamw_bnb_8bit": ("adamw_8bit", "bitsandbytes' 8-bit AdamW"),
        "paged_adamw_32bit": (
            "adamw_torch",
            'the same AdamW with 32-bit states, not paged; "paged_adamw_8bit" pages 8-bit ones',
        ),
    },
    "preset": {
        # Axolotl's `type: chat_template` reads a "messages" list of role and content by default.
        "chat_template": ("messages", 'a "messages" list of role and content, as Axolotl\'s chat_template'),
    },
}

# Of those, the ones whose value does not carry over as it is: renaming `warmup_steps: 100` would give
# `warmup_ratio: 100` (a fraction of the run, below 1), `bf16: true` would give `precision: true`.
NOT_A_RENAME: dict[str, str] = {
    "warmup_steps": "set 'warmup_ratio' to the fraction of the run's steps to warm up over (warmup_steps "
    "100 of max_steps 1000 is 0.1), and remove 'warmup_steps'",
    # Axolotl's `bf16: auto` is bf16 where the GPU has it; here a GPU without it is X001, which says so.
    "bf16": 'replace it with "precision": "bf16" where it was true or auto (X001 names a GPU without '
    "bf16); remove it where it was false",
    "fp16": 'replace it with "precision": "fp16" where it was true; remove it where it was false',
    "mixed_precision": 'replace it with "precision": one of "bf16", "fp16" or "fp32"',
    "load_in_4bit": 'replace it with "quantization": "4bit" (remove it where it was false)',
    "load_in_8bit": 'replace it with "quantization": "8bit" (remove it where it was false)',
    "quantization_bit": 'replace it with "quantization": "4bit" for 4, "8bit" for 8',
    # Axolotl's list of sources (each with `path` and `type`), or one dataset's name: `data` holds sources
    # in `train` (and `eval`), each a `path` and its format's `preset`.
    "datasets": _SOURCES_FIX,
    # LLaMA-Factory's `dataset: identity,alpaca_en_demo`: names of entries in its dataset_info.json.
    "dataset": 'give its sources as "data": {"train": [{"path": ..., "preset": ...}]}, one per name: '
    "LLaMA-Factory's names are entries of dataset_info.json in its dataset_dir, each one's \"file_name\" "
    'the "path" and its "formatting" the "preset" ("alpaca" where it names none); and remove it',
    "dataset_name": 'give it as "data": {"train": [{"path": ...}]} (the Hub id, read when the worker is '
    "online, or the directory it was downloaded to), and remove it",
    # causal_lm trains on an answer; a text column alone is masked_lm's `text` preset.
    "dataset_text_field": "a causal_lm recipe trains on answers, not plain text: map each source's columns "
    'as "fields": {"question": ..., "answer": ...} (or use "preset": "messages" or "prompt_completion"); '
    f"to train on the text column itself, {OWN_SCRIPT}, and remove it",
    # The recipe trains a LoRA adapter unless "adapter" is null: use_peft false is a full fine-tune.
    "use_peft": 'remove it where it was true ("adapter" is LoRA by default; its lora_* keys go in it); '
    'where it was false, set "adapter": null for a full fine-tune',
    "finetuning_type": 'remove it where it was "lora" ("adapter" is LoRA by default; its lora_* keys go in '
    'it); for "full" set "adapter": null; for "freeze", "adapter": null and model.freeze naming the parts '
    "that stay frozen",
    # LLaMA-Factory's comma-separated names, or "all".
    "lora_target": 'give it as "target_modules": a list of module names (["q_proj", "v_proj"] for '
    '"q_proj,v_proj"), or "all-linear" for "all"',
}

# Where a conversation's format comes from, named by the keys other tools choose a chat template with.
_MODELS_TEMPLATE = (
    'conversations ("preset": "messages", "sharegpt") are rendered with the model\'s own chat '
    "template (its tokenizer_config.json's, or a chat_template.jinja beside it: put one there to choose "
    "another); other presets' prompts are data.prompt_template; there is no setting naming a template"
)

# Other tools' settings for what Flightdeck always does: the recipe has no key for them, and removing
# one loses nothing. Said, so that "remove it" does not read as dropping a setting the run needs.
ALWAYS_DONE: dict[str, str] = {
    # causal_lm supervises the answer's tokens only (docs/recipe.md, `task`).
    "train_on_inputs": "a causal_lm recipe trains on the answer's tokens only, never the prompt's "
    "(train_on_inputs false); there is no setting for it",
    "output_dir": "each attempt writes its checkpoints and model under output/ in its own run directory "
    "(flightdeck show <id> prints it; a script job's args name it as {output_dir}); there is no setting "
    "for it",
    "resume_from_checkpoint": "a retry resumes from the last complete checkpoint of the job's earlier "
    "attempts by itself; there is no setting for it",
    "local_rank": "torchrun gives each rank its LOCAL_RANK; there is no setting for it",
    "report_to": "every step's metrics go to Flightdeck (flightdeck watch, GET /jobs/<id>/metrics); there "
    "is no setting for it",
    # LLaMA-Factory's (`template: qwen3_nothink`) and Axolotl's (`chat_template: llama3`) name of a chat
    # format: the model's own template renders conversations here.
    "template": _MODELS_TEMPLATE,
    "chat_template": _MODELS_TEMPLATE,
    # LLaMA-Factory's folder of its dataset_info.json: a source's path is its file.
    "dataset_dir": "each source's \"path\" names its file in the workspace (LLaMA-Factory's dataset_dir "
    "joined with the entry's file_name); there is no setting for it",
}


# Values other tools write for "not set" where the recipe leaves the key out, and what that means here.
NOT_SET: dict[tuple[str, str], tuple[Any, str]] = {
    ("training", "max_steps"): (-1, "no limit: training.epochs decides"),  # TrainingArguments' -1
}


def default_at(loc: tuple[int | str, ...]) -> tuple[Any] | None:
    """The default of the key at `loc`, as a 1-tuple (a default may be null), or None if it has none."""
    if not loc or not isinstance(loc[-1], str):
        return None
    for node in _nodes_at(loc[:-1]):
        field = node.get("properties", {}).get(loc[-1], {})
        if "default" in field:
            return (field["default"],)
    return None


def not_set_fix(loc: tuple[int | str, ...], value: Any, *, in_stage: bool = False) -> str | None:
    """The fix for a value meaning "not set" (null, TrainingArguments' max_steps -1) where the recipe
    takes none: leave the key out, and its default applies (in a stage, the top level's value)."""
    default = default_at(loc)
    sentinel, meaning = NOT_SET.get((str(loc[-2]), str(loc[-1])), (None, "")) if len(loc) >= 2 else (None, "")
    if default is None or value != sentinel:
        return None
    described = meaning or json.dumps(default[0])
    applies = (
        f"the top level's value applies (or the default: {described})"
        if in_stage
        else f"the default applies ({described})"
    )
    return f"remove it: {json.dumps(value)} is how other tools say 'not set', and without it {applies}"


def _recipe_name(container: str, key: str, allowed: list[str]) -> str | None:
    """`key` as the recipe names it in `container` (a section, '' for the top level): itself, or what
    another tool calls it, when the schema allows that name there."""
    name = key if key in allowed else OTHER_TOOLS_NAMES.get(container, {}).get(key.lower())
    return name if name in allowed else None


def _container(loc: tuple[int | str, ...]) -> str:
    """OTHER_TOOLS_NAMES' name for the object at `loc`: ('data', 'train', 0) -> 'data.train[]'."""
    name = ".".join(part for part in loc if isinstance(part, str))
    return name + "[]" if loc and isinstance(loc[-1], int) else name


def recipe_key(section: str, key: str) -> str | None:
    """`key` as `section` names it: itself, or the recipe's name for another tool's (`lora_alpha`)."""
    return _recipe_name(section, key, allowed_keys((section,)))


def home_section(key: str, sections: Iterable[str]) -> tuple[str, str] | None:
    """The section an unknown top-level `key` belongs in, and its name there, when it is one of that
    section's keys as the recipe or another tool names it. A flat config (Axolotl's, a YAML of
    TrainingArguments) puts `learning_rate`, `lora_r` or `base_model` at the top; "remove it" would lose
    the setting, and a spelling match would take `learning_rate` for the `training` section itself."""
    for section in sections:
        name = recipe_key(section, key)
        if name is not None:
            return section, name
    return None


def inner_home(section: str, key: str) -> tuple[str, bool] | None:
    """The key of `section` holding objects of which `key` is one (a data source's `path` given in
    `data` itself belongs in each of `data.train`), and whether it holds a list of them."""
    for node in _nodes_at((section,)):
        for name in node.get("properties", {}):  # as declared: `train` before `eval`
            for inner in _nodes_at((section, name)):
                if inner.get("type") == "array" and key in allowed_keys((section, name, 0)):
                    return name, True
                if inner.get("type") == "object" and key in inner.get("properties", {}):
                    return name, False
    return None


def move_fix(key: str, section: str, name: str, value: Any = None) -> str:
    """The fix for `key` given at the top level that belongs in `section` as `name`."""
    rebuilt = _not_a_rename(key, value)
    if rebuilt is not None:
        return f"in '{section}': {rebuilt}"
    return (
        f"move '{key}' into '{section}'" + ("" if name == key else f" as '{name}'") + _as_value(name, value)
    )


def rename_fix(key: str, near: str, value: Any = None) -> str:
    """The fix for an unknown `key` whose recipe name is `near`: a rename, unless the value changes too."""
    return _not_a_rename(key, value) or f"rename '{key}' to '{near}'" + _as_value(near, value)


def _not_a_rename(key: str, value: Any) -> str | None:
    if key.lower() == "datasets":
        return sources_fix(value)
    return NOT_A_RENAME.get(key.lower())


def sources_fix(value: Any) -> str:
    """Axolotl's `datasets` list written as the recipe's sources, each entry's `path` kept, its `type`
    as the preset (`chat_template` is "messages"), its turns' column as the preset's field and its
    `split` as the source's (a first-rows slice as "max_samples"); the settings with no counterpart
    named, so that following the fix drops nothing unsaid; the general fix for any other value."""
    entries = value if isinstance(value, list) and value else None
    if entries is None or not all(isinstance(e, dict) and isinstance(e.get("type"), str) for e in entries):
        return _SOURCES_FIX  # not a list of typed sources: a format spelled out field by field, say
    sources, renamed, dropped = [], {}, []
    for entry in entries:
        kind, path = entry["type"], entry.get("path")
        found = other_value("preset", kind)
        if found is not None:
            renamed[kind] = found[0]
        given = json.dumps(path) if isinstance(path, str) else "..."
        preset = found[0] if found else kind
        source = f'{{"path": {given}, "preset": {json.dumps(preset)}'
        # Axolotl's chat_template reads the turns from `field_messages` ("messages" unless set).
        column = entry.get("field_messages")
        if preset == "messages" and isinstance(column, str) and column != "messages":
            source += f', "fields": {{"messages": {json.dumps(column)}}}'
        split = entry.get("split")
        if isinstance(split, str):
            name, first = _split_slice(split)
            if name is None:
                dropped.append(
                    f'"split": {json.dumps(split)} of {given} (a source reads a whole split; '
                    '"max_samples": N keeps its first N rows)'
                )
            else:
                source += f', "split": {json.dumps(name)}' if name != "train" else ""
                source += f', "max_samples": {first}' if first is not None else ""
        roles = entry.get("roles_to_train")
        if isinstance(roles, list) and not set(map(str, roles)) <= _ASSISTANT_ROLES:
            dropped.append(
                f'"roles_to_train": {json.dumps(roles)} of {given} (conversations are trained on '
                "the assistant's turns only)"
            )
        sources.append(source + "}")
    why = 'Axolotl\'s "type" is the "preset"' + "".join(
        f'; "{theirs}" is "{ours}"' for theirs, ours in renamed.items()
    )
    fix = f'give its sources as "data": {{"train": [{", ".join(sources)}]}} ({why}), and remove it'
    return fix + (f"; not carried: {'; '.join(dropped)}" if dropped else "")


# The roles Axolotl's chat_template trains by default, under their names in the formats it reads: what the
# recipe's conversations train on (the assistant's turns), so nothing is lost.
_ASSISTANT_ROLES = {"assistant", "gpt", "model"}


def _split_slice(split: str) -> tuple[str | None, int | None]:
    """A `datasets` split as the recipe's source takes it: ('train', None) for "train", ('train', 1000)
    for its first rows "train[:1000]"; (None, None) for any other slice (a percentage, a start)."""
    name, bracket, rest = split.partition("[")
    if not bracket:
        return split, None
    head = rest.removesuffix("]").removeprefix(":")
    if rest.startswith(":") and rest.endswith("]") and head.isdigit() and int(head) > 0:
        return name, int(head)
    return None, None


def other_value(name: str, value: Any) -> tuple[str, str] | None:
    """The recipe's value for another tool's `value` of the recipe key `name`, and what it is."""
    return OTHER_TOOLS_VALUES.get(name, {}).get(value.lower()) if isinstance(value, str) else None


def value_fix(name: str, value: Any) -> str | None:
    """The fix for a value `name` does not take that is another tool's name for one it does."""
    found = other_value(name, value)
    return f'give it as "{name}": "{found[0]}" ({found[1]})' if found else None


def _as_value(name: str, value: Any) -> str:
    found = other_value(name, value)
    return f', its value as "{found[0]}" ({found[1]})' if found else ""


def other_tools_name(loc: tuple[int | str, ...], value: Any) -> str | None:
    """The recipe's name for the unknown key at the end of `loc` when it is another tool's name for it."""
    if not loc or not isinstance(loc[-1], str):
        return None
    key, where = loc[-1], loc[:-1]
    alias = _recipe_name(_container(where), key, allowed_keys(where))
    # A key whose value changes anyway (`datasets`' list becomes `data`'s object) is named all the same.
    if alias is not None and (key.lower() in NOT_A_RENAME or takes((*where, alias), value)):
        return alias
    return None


def misspelling(loc: tuple[int | str, ...], value: Any) -> str | None:
    """The allowed key that the unknown one at the end of `loc` is a typo of, if it can hold `value`."""
    if not loc or not isinstance(loc[-1], str):
        return None
    key, where = loc[-1], loc[:-1]
    by_lower = {name.lower(): name for name in allowed_keys(where)}  # `DATA` is `data` with caps lock on
    near = [by_lower[n] for n in difflib.get_close_matches(key.lower(), list(by_lower), n=3, cutoff=0.6)]
    return next((name for name in near if is_typo(key, name) and takes((*where, name), value)), None)


@cache
def places(key: str) -> int:
    """How many objects of the schema have `key`: `path` is the model's and each data source's, so a
    `path` found out of place cannot be said to be either's."""
    schema = _recipe_schema()
    return sum(key in node.get("properties", {}) for node in [schema, *schema.get("$defs", {}).values()])


def is_typo(key: str, name: str) -> bool:
    """Whether `key` is `name` mistyped: at most two letters dropped, added, changed or swapped (one for a
    short name). A close name that is another word longer or different is another setting: renaming
    TrainingArguments' `per_device_eval_batch_size` to `per_device_batch_size` would change the training
    batch size, and `eval_strategy` is no `eval_steps`."""
    return _edits(key.lower(), name.lower()) <= (2 if len(name) >= 6 else 1)


def _edits(a: str, b: str) -> int:
    """Letters dropped, added, changed or swapped with the next to turn `a` into `b` (the optimal string
    alignment distance)."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def section_as_one_value(section: str, value: Any, *, in_stage: bool = False) -> str | None:
    """The fix for a section given as one value, as other tools take it: Axolotl's `adapter: lora` (or
    `qlora`), a model's name for `model`, a data file (or Axolotl's list of sources) for `data`. In a
    stage an object is merged over the top level's, so `{}` keeps its settings."""
    if section == "model" and isinstance(value, str):
        return f'give it as "model": {{"path": {json.dumps(value)}}}'
    if section == "data" and isinstance(value, str):
        return f'give it as "data": {{"train": [{{"path": {json.dumps(value)}}}]}}'
    if section == "data" and isinstance(value, list):
        return 'give the list as "data": {"train": [...]}, each source a "path" and its "preset"'
    if section != "adapter" or not isinstance(value, str | bool):
        return None
    word = "lora" if value is True else str(value).lower()  # `true`: "train an adapter"
    if value is False or word in ("none", "full", ""):
        return 'for a full fine-tune set "adapter": null'
    if word not in ("lora", "qlora"):
        return (
            'Flightdeck trains LoRA adapters ("adapter": {} for the defaults) or, with "adapter": null, every '
            f"weight model.freeze leaves trainable; for another method than {value!r}, {OWN_SCRIPT}"
        )
    default = AdapterSpec()
    defaults = f"r {default.r}, alpha {default.alpha:g}, target_modules {json.dumps(default.target_modules)}"
    takes = (
        f"keeps the top level's adapter settings (the defaults where it sets none: {defaults})"
        if in_stage
        else f"takes the defaults ({defaults})"
    )
    lora = (
        f'give LoRA\'s settings as an object: "adapter": {{}} {takes}, or set "r", "alpha" and '
        '"target_modules" in it'
    )
    return lora + ', and set "quantization": "4bit" in "model"' if word == "qlora" else lora
