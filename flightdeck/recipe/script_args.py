"""What a script job's arguments say about its run, where they are the well-known HF ones.

`run_clm.py`, TRL's `sft.py` and most teams' scripts take `transformers.TrainingArguments` from the
command line (HfArgumentParser): `--learning_rate 2e-5` or `--learning_rate=2e-5`, booleans as a bare
`--bf16` or `--bf16 true`. Read here into the recipe parts a script job did not declare, so the same
static and host rules and the same memory estimate as a recipe job can run on them
(flightdeck/preflight/script_checks.py). Where an argument is absent, the HF default stands in (a
Trainer's batch is 8 per device, accumulation 1, full precision, no checkpointing), since that is
what the script will run with. Nothing read here reaches the script: its argv is never rewritten.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from flightdeck.recipe.near_keys import recipe_key
from flightdeck.recipe.schema import Recipe

# The argument -> (recipe path, how its value reads). Aliases of one path come in order of preference.
_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}
WORKSPACE_PLACE = "{workspace}/"
# TrainingArguments' defaults: what the script runs with when it does not pass the argument.
HF_TRAINING_DEFAULTS: dict[str, Any] = {
    "per_device_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "learning_rate": 5e-5,
    "epochs": 3,
    "precision": "fp32",
    "max_grad_norm": 1.0,
    "warmup_ratio": 0.0,
}
# run_clm's block_size and TRL's max_length both default to 1024 tokens (capped by the model).
HF_SEQUENCE_DEFAULT = 1024
# Where the data comes from is the script's business; the estimate needs only the sequence length.
SCRIPT_DATA = "(read by the script)"


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"'{value}' is not a boolean (true/false)")


def _max_steps(value: str) -> int | None:
    steps = int(value)
    return steps if steps > 0 else None  # -1: the Trainer's "by epochs"


# The TrainingArguments read into the recipe's `training`, by their own names (near_keys has the recipe's).
TRAINER_TRAINING_ARGUMENTS = (
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "num_train_epochs",
    "max_grad_norm",
    "warmup_ratio",
)
BOOLEAN_FLAGS = {"--bf16", "--fp16", "--gradient_checkpointing", "--use_peft"}
_READERS: dict[str, Callable[[str], Any]] = {
    "--learning_rate": float,
    "--per_device_train_batch_size": int,
    "--gradient_accumulation_steps": int,
    "--max_steps": _max_steps,
    "--num_train_epochs": float,
    "--max_grad_norm": float,
    "--warmup_ratio": float,
    "--dataloader_num_workers": int,
    "--model_name_or_path": str,
    "--torch_dtype": str,
    "--dtype": str,
    "--max_seq_length": int,
    "--max_length": int,
    "--block_size": int,
    "--lora_r": int,
    "--lora_alpha": float,
    "--lora_target_modules": str,
    **{flag: _bool for flag in BOOLEAN_FLAGS},
}
_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "auto": None}


@dataclass
class ScriptArguments:
    """The well-known arguments a script job passes: {flag: value} and {flag: the argv text}."""

    values: dict[str, Any] = field(default_factory=dict)
    given: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # e.g. "--learning_rate: 'fast' is not a number"

    def said(self, *flags: str) -> str:
        """How the argv spelled these flags, for a message: '--bf16 --per_device_train_batch_size 8'."""
        return " ".join(self.given[f] for f in flags if f in self.given)


def read_script_arguments(args: list[str]) -> ScriptArguments:
    """The well-known HF arguments in `args`, both `--x v` and `--x=v`; the last one given wins."""
    read = ScriptArguments()
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not arg.startswith("--"):
            continue
        flag, equals, inline = arg.partition("=")
        reader = _READERS.get(flag)
        if reader is None:
            continue
        if equals:
            text, shown = inline, arg
        elif flag in BOOLEAN_FLAGS and (index >= len(args) or args[index].startswith("--")):
            text, shown = "true", arg  # a bare `--bf16`
        elif index < len(args):
            text, shown = args[index], f"{arg} {args[index]}"
            index += 1
        else:
            continue
        try:
            read.values[flag] = reader(text)
        except ValueError:
            read.problems.append(f"{flag}: '{text[:60]}' is not what it takes")
            continue
        read.given[flag] = shown
    return read


def describes_hf_run(read: ScriptArguments) -> bool:
    """Only a script that takes the Trainer's own arguments is judged by the Trainer's defaults."""
    return any(
        flag in read.values
        for flag in ("--model_name_or_path", "--per_device_train_batch_size", "--learning_rate")
    )


def described_recipe(recipe: Recipe) -> tuple[Recipe, dict[str, str]] | None:
    """The script job as its arguments describe it: the parts it does not declare filled from them
    (and the HF defaults), with {recipe path: the arguments it came from}; None when the arguments are
    not the HF ones or say nothing the recipe does not already declare. ValueError naming the
    arguments when a value lies outside what a recipe allows (`--learning_rate 1e4`)."""
    entry = recipe.entrypoint
    if entry is None:
        return None
    read = read_script_arguments(entry.args)
    if not describes_hf_run(read):
        return None
    v = read.values
    data = recipe.model_dump(mode="json", exclude_none=False)
    sources: dict[str, str] = {}
    if recipe.training is None:
        training = dict(HF_TRAINING_DEFAULTS)
        for name in TRAINER_TRAINING_ARGUMENTS:
            flag, key = f"--{name}", recipe_key("training", name)  # num_train_epochs is training.epochs
            if flag in v and key is not None:
                training[key] = v[flag]
                sources[f"training.{key}"] = read.said(flag)
        if v.get("--bf16") or v.get("--fp16"):
            training["precision"] = "bf16" if v.get("--bf16") else "fp16"
            sources["training.precision"] = read.said("--bf16", "--fp16")
        if training.get("max_grad_norm") == 0:
            training["max_grad_norm"] = None
        data["training"] = training
        sources.setdefault("training", "the HF Trainer's defaults")
    if recipe.model is None and "--model_name_or_path" in v:
        path = str(v["--model_name_or_path"])
        dtype = _DTYPES.get(str(v.get("--dtype", v.get("--torch_dtype", "float32")))) or "float32"
        data["model"] = {
            "path": path[len(WORKSPACE_PLACE) :] if path.startswith(WORKSPACE_PLACE) else path,
            "dtype": dtype,
            "gradient_checkpointing": bool(v.get("--gradient_checkpointing", False)),
        }
        sources["model.path"] = read.said("--model_name_or_path")
        for key, flags in (
            ("dtype", ("--dtype", "--torch_dtype")),
            ("gradient_checkpointing", ("--gradient_checkpointing",)),
        ):
            if read.said(*flags):
                sources[f"model.{key}"] = read.said(*flags)
        if recipe.adapter is None and v.get("--use_peft"):
            adapter: dict[str, Any] = {"r": v.get("--lora_r", 16), "alpha": v.get("--lora_alpha", 32)}
            if "--lora_target_modules" in v:
                adapter["target_modules"] = str(v["--lora_target_modules"]).split(",")
            data["adapter"] = adapter
            sources["adapter"] = read.said("--use_peft", "--lora_r", "--lora_alpha", "--lora_target_modules")
    if recipe.data is None and (data.get("model") or "--dataloader_num_workers" in v):
        length = next((v[f] for f in ("--max_seq_length", "--max_length", "--block_size") if f in v), None)
        data["data"] = {
            "train": [{"path": SCRIPT_DATA}],
            "max_seq_length": length or HF_SEQUENCE_DEFAULT,
            "num_workers": v.get("--dataloader_num_workers", 0),
        }
        sources["data.num_workers"] = read.said("--dataloader_num_workers")
        sources["data.max_seq_length"] = (
            read.said("--max_seq_length", "--max_length", "--block_size")
            or f"{HF_SEQUENCE_DEFAULT} (the default)"
        )
    if not sources:
        return None
    try:
        return Recipe.model_validate(data), sources
    except ValidationError as exc:
        # e.g. --learning_rate 1e4: beyond what a recipe allows, so beyond what the checks model.
        said = [
            f"{sources.get('.'.join(map(str, e['loc'][:2])), '.'.join(map(str, e['loc'])))}: {e['msg']}"
            for e in exc.errors()
        ]
        raise ValueError("; ".join(said)) from None
