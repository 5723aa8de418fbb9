"""The recipe: the one source of truth for what a training job may ask for.

The top-level keys are a contract (docs/recipe.md): extend, never rename. Every model
forbids unknown keys so a typo is refused with its path instead of ignored.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from flightdeck.recipe.model_parts import PARTS

PREVIOUS_STAGE = "@previous"
PRESETS = ("chartqa", "infovqa", "ocrvqa", "alpaca", "text")
DATA_FORMATS = ("jsonl", "json", "csv", "parquet", "txt")
# A script job runs the user's file; a recipe job runs the trainer, built from these parts.
RECIPE_PARTS = ("model", "data")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _no_parent_steps(path: str, what: str) -> str:
    """A workspace path never climbs out with '..' (the worker also resolves symlinks, S001)."""
    if ".." in path.replace("\\", "/").split("/"):
        raise ValueError(
            f"'{path[:200]}' has a '..' step; {what} are named inside the worker's workspace (or an "
            "allowed root) without '..'"
        )
    return path


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelSpec(StrictModel):
    path: Annotated[str, Field(min_length=1, max_length=4096, description="Local directory or hub id.")]
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    quantization: Literal["4bit", "8bit"] | None = Field(
        None, description="bitsandbytes quantisation of the frozen base (QLoRA)."
    )
    quantization_skip_modules: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        description="Modules kept in full precision when quantising: full prefixes ('model.visual') or "
        "the part 'vision_tower'; checked after load (V005).",
    )
    device_map: Literal["auto", "balanced", "balanced_low_0", "sequential"] | None = Field(
        None, description="null: one replica per GPU under DDP. Set: one process spreads the model over GPUs."
    )
    max_memory: dict[str, str] | None = Field(
        None, description="Per-device memory cap for device_map, e.g. {'0': '20GiB', 'cpu': '64GiB'}."
    )
    gradient_checkpointing: bool = True
    gradient_checkpointing_reentrant: bool = Field(
        False, description="Reentrant checkpointing breaks DDP + PEFT (G004); keep false."
    )
    use_cache: bool = Field(
        False, description="KV cache during training; must be off with checkpointing (G008)."
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    freeze: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        default_factory=list,
        description="Frozen before the adapter is added: regular expressions over parameter names, or the "
        "named parts 'vision_tower', 'projector', 'language_model' (resolved per architecture).",
    )

    @field_validator("path")
    @classmethod
    def _path_inside(cls, path: str) -> str:
        return _no_parent_steps(path, "models")

    @field_validator("freeze")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if pattern in PARTS:
                continue
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"'{pattern}' is not a valid regular expression ({exc}); escape it") from exc
        return patterns


class AdapterSpec(StrictModel):
    type: Literal["lora"] = "lora"
    r: Annotated[int, Field(ge=1, le=4096)] = 16
    alpha: Annotated[float, Field(gt=0, le=1e6)] = 32
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    target_modules: list[Annotated[str, Field(min_length=1, max_length=256)]] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        min_length=1,
        description="Linear module names ('q_proj'), or names within a part ('language_model.q_proj'), "
        "or 'all-linear'.",
    )
    modules_to_save: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(default_factory=list)


class DataSource(StrictModel):
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    preset: (
        Literal["chartqa", "infovqa", "ocrvqa", "alpaca", "messages", "sharegpt", "prompt_completion", "text"]
        | None
    ) = None
    fields: dict[str, Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        None, description="Recipe field name -> column in this dataset; overrides the preset's map."
    )
    format: Literal["jsonl", "json", "csv", "parquet", "arrow", "txt"] | None = Field(
        None, description="File format; by default taken from the file extension."
    )
    split: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        None,
        description="For a dataset directory (a Hub snapshot, save_to_disk output, train.jsonl/val.jsonl) "
        "or a hub id: which split to read; by default 'train'.",
    )
    max_samples: Annotated[int, Field(ge=1)] | None = None
    # issue 32: a corpus larger than memory is read as a stream (no length: training.max_steps, D009).
    streaming: bool = Field(
        False,
        description="Read the source as a stream (Hugging Face datasets streaming): nothing converted or "
        "held in memory, no length, so training.max_steps is required (D009).",
    )

    @field_validator("path")
    @classmethod
    def _path_inside(cls, path: str) -> str:
        return _no_parent_steps(path, "datasets")


class DataSpec(StrictModel):
    train: list[DataSource] = Field(min_length=1)
    eval: list[DataSource] = Field(default_factory=list)
    max_seq_length: Annotated[int, Field(ge=8, le=1_048_576)] = 512
    prompt_template: Annotated[str, Field(min_length=0, max_length=65536)] = "Question: {question}\nAnswer: "
    num_workers: Annotated[int, Field(ge=0, le=64)] = 2
    max_pixels: Annotated[int, Field(ge=784, le=100_000_000)] | None = Field(
        None, description="vision_language: resize images to at most this many pixels (fewer image tokens)."
    )
    blank_image_for_text_rows: bool = Field(
        False,
        description="vision_language: give text-only rows a blank image so every rank runs the vision "
        "tower and projector (V003 sets it when either trains under DDP).",
    )


class TrainingSpec(StrictModel):
    per_device_batch_size: Annotated[int, Field(ge=1, le=65536)] = 2
    gradient_accumulation_steps: Annotated[int, Field(ge=1, le=65536)] = 32
    learning_rate: Annotated[float, Field(gt=0, le=10)] = 1.8e-5
    epochs: Annotated[float, Field(gt=0, le=10000)] = 1
    max_steps: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    optimizer: Literal["adamw_torch", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd"] = "adamw_torch"
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "linear"
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.03
    weight_decay: Annotated[float, Field(ge=0, le=10)] = 0.0
    max_grad_norm: Annotated[float, Field(gt=0, le=1e6)] | None = 1.0
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 42
    logging_steps: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    save_steps: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    eval_steps: Annotated[int, Field(ge=1, le=100_000_000)] | None = Field(
        None,
        description="Evaluate on data.eval every this many optimizer steps; by default at the end of each "
        "epoch and after the last step.",
    )
    ddp_find_unused_parameters: bool = Field(
        False, description="Only for trainable modules outside the forward path (G005); conflicts with G004."
    )
    remove_unused_columns: bool = Field(
        False,
        description="The Trainer's removal of sample keys the model's forward does not take; it drops the "
        "image and text the collator needs (V004), so Flightdeck keeps it off.",
    )


class EntrypointSpec(StrictModel):
    """The user's own training program, run by torchrun on every node instead of the trainer."""

    script: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        None, description="A Python file relative to the worker's workspace, e.g. 'scripts/train.py'."
    )
    module: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        None, description="A module in the workspace run as 'python -m', e.g. 'mypkg.train'."
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=256,
        description="Arguments passed to the script as an argv list (never through a shell); '{run_dir}', "
        "'{workspace}' and '{output_dir}' in an argument are replaced by the attempt's directories, "
        "'{resume_from}' by the checkpoint a retry resumes from (empty when none; also in "
        "FLIGHTDECK_RESUME_FROM).",
    )
    requirements: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        None,
        description="A pip requirements file relative to the worker's workspace, e.g. 'scripts/requirements.txt': "
        "the job runs in an environment of its own layered over the worker's (the worker's torch is kept), "
        "built once per content of the file and reused.",
    )
    instrument: bool = Field(
        True,
        description="Watch the unmodified script: every HF Trainer gets FlightdeckCallback, a plain loop is "
        "watched at its optimizer's steps, a hang after the script's end is teardown (H008). false: a bare "
        "launch.",
    )

    @field_validator("script")
    @classmethod
    def _script_in_workspace(cls, script: str | None) -> str | None:
        # The agent also resolves symlinks on the host (S001); this refuses what can never be inside.
        if script is None:
            return None
        parts = script.replace("\\", "/").split("/")
        if script.startswith(("/", "~")) or ".." in parts or "\x00" in script:
            raise ValueError(
                f"'{script[:200]}' must be a path relative to the worker's workspace, without '..'; "
                "put the script in the workspace and name it from there"
            )
        if not script.endswith(".py"):
            raise ValueError(
                f"'{script[:200]}' is not a Python file (.py); torchrun runs the script with Python, so name "
                "the training script itself (a module: 'module' instead of 'script')"
            )
        return script

    @field_validator("requirements")
    @classmethod
    def _requirements_in_workspace(cls, requirements: str | None) -> str | None:
        if requirements is None:
            return None
        parts = requirements.replace("\\", "/").split("/")
        if requirements.startswith(("/", "~")) or ".." in parts or "\x00" in requirements:
            raise ValueError(
                f"'{requirements[:200]}' must be a path relative to the worker's workspace, without '..'; "
                "put the requirements file in the workspace and name it from there"
            )
        return requirements

    @field_validator("module")
    @classmethod
    def _module_name(cls, module: str | None) -> str | None:
        if module is not None and not _MODULE_NAME.fullmatch(module):
            raise ValueError(f"'{module[:200]}' is not a dotted module name like 'mypkg.train'")
        return module

    @field_validator("args")
    @classmethod
    def _args_printable(cls, args: list[str]) -> list[str]:
        for index, arg in enumerate(args):
            if "\x00" in arg:
                raise ValueError(f"args[{index}] contains a NUL character, which no argv can carry")
        return args

    @model_validator(mode="after")
    def _one_program(self) -> EntrypointSpec:
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of 'script' (a file in the workspace) or 'module'")
        return self

    def program(self) -> list[str]:
        """What follows torchrun's own options: the script (or -m module) and its arguments."""
        head = ["-m", self.module] if self.module is not None else [str(self.script)]
        return [*head, *self.args]


# sbatch --time's forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_SLURM_TIME = re.compile(r"^(\d{1,6}|\d{1,6}:\d{2}|\d{1,4}:\d{2}:\d{2}|\d{1,4}-\d{1,2}(:\d{2}){0,2})$")


def slurm_time_seconds(value: str) -> int | None:
    """sbatch --time's forms (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds; None for
    anything else (UNLIMITED, a partition's default)."""
    if not _SLURM_TIME.match(value):
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:  # MM:SS
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:  # minutes
        hours, minutes, seconds = 0, parts[0], 0
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


# Partition names and node features: Slurm's names hold no spaces, quotes or shell characters.
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")
# --constraint: features joined by & | , with [ ] ( ) grouping and *N counts.
_SLURM_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.+\-&|,\[\]()*]{1,512}$")


class SlurmSpec(StrictModel):
    """Per-job sbatch options for the Slurm executor (docs/slurm.md); each wins over the worker's own."""

    partition: str | None = Field(None, description="sbatch --partition for this job.")
    time: str | None = Field(None, description="sbatch --time (e.g. 04:00:00, 1-12:00:00, 90).")
    constraint: str | None = Field(None, description="sbatch --constraint, node features (e.g. a100&ib).")

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_NAME.match(value):
            raise ValueError(
                "a Slurm partition name (letters, digits, _ . + -), as `sinfo -s` lists them, e.g. gpu"
            )
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_TIME.match(value):
            raise ValueError(
                "a time limit as sbatch --time takes it: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                "D-HH:MM:SS, e.g. 04:00:00"
            )
        return value

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_CONSTRAINT.match(value):
            raise ValueError(
                "node features as sbatch --constraint takes them, joined by & | or , (no spaces), "
                "e.g. a100&ib"
            )
        return value


class ResourcesSpec(StrictModel):
    nodes: Annotated[int, Field(ge=1, le=1024)] = 1
    # Default 1 rather than DESIGN's example 8, so a recipe without resources fits any worker.
    gpus_per_node: Annotated[int, Field(ge=1, le=64)] = 1
    gpu_memory_gb: Annotated[float, Field(gt=0, le=100_000)] | None = Field(
        None, description="Minimum memory per GPU a worker must have to claim the job."
    )
    accelerator: Literal["gpu", "cpu", "any"] = Field(
        "gpu", description="'cpu' or 'any' lets a CPU worker (gloo, one process per slot) run the job."
    )
    slurm: SlurmSpec | None = Field(
        None, description="sbatch options for this job when a Slurm worker runs it; other workers ignore it."
    )


class HealthSpec(StrictModel):
    zero_grad_patience: Annotated[int, Field(ge=1, le=10000)] = 2
    nonfinite_patience: Annotated[int, Field(ge=1, le=10000)] = 1
    grad_norm_limit: Annotated[float, Field(gt=0, le=1e12)] = 1000.0
    grad_norm_patience: Annotated[int, Field(ge=1, le=10000)] = 3
    stall_factor: Annotated[float, Field(gt=1, le=10000)] = 10
    flat_loss_patience: Annotated[int, Field(ge=2, le=1_000_000)] = 50
    flat_loss_epsilon: Annotated[float, Field(ge=0, le=1)] = 1e-6
    teardown_grace_seconds: Annotated[float, Field(ge=1, le=3600)] = Field(
        30.0,
        description="How long a job's processes may live after its end on every rank (a recipe job: its "
        "result written; a script job: the script's end; a bare launch: idle after a rank exited or the "
        "Trainer's end-of-training line) before they are ended and the job succeeds with a warning (H008).",
    )


# --- env: an allow-list, each value checked (E006) -------------------------------------------

_ENV_EXACT: dict[str, str] = {
    "OMP_NUM_THREADS": "positive_int",
    "MKL_NUM_THREADS": "positive_int",
    "TOKENIZERS_PARALLELISM": "bool_word",
    "SHIRG_NO_DEVICE_MAP": "zero_one",
    "MASTER_PORT": "port",
    "PYTORCH_CUDA_ALLOC_CONF": "alloc_conf",
    "CUDA_LAUNCH_BLOCKING": "zero_one",
    "TORCH_DISTRIBUTED_DEBUG": "dist_debug",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "zero_one",
    "TORCH_NCCL_BLOCKING_WAIT": "zero_one",
    "WANDB_DISABLED": "bool_word",
    "WANDB_MODE": "plain",
}
# Hub and transformers switches that only change behaviour, never where data is read or written.
_ENV_EXACT.update(
    dict.fromkeys(
        (
            "HF_HUB_OFFLINE",
            "HF_DATASETS_OFFLINE",
            "HF_HUB_DISABLE_TELEMETRY",
            "HF_HUB_DISABLE_PROGRESS_BARS",
            "HF_HUB_ENABLE_HF_TRANSFER",
            "TRANSFORMERS_OFFLINE",
            "TRANSFORMERS_NO_ADVISORY_WARNINGS",
        ),
        "bool_word",
    )
)
_ENV_EXACT["TRANSFORMERS_VERBOSITY"] = "plain"
_ENV_PREFIXES = ("NCCL_",)
# NCCL variables that name files, plugins or libraries would let a recipe write anywhere or load code;
# those that name addresses, ports, interfaces or ids (NCCL_COMM_ID, NCCL_RAS_ADDR, NCCL_SOCKET_IFNAME)
# would redirect the bootstrap or open a listener: only the launch plan sets where ranks meet.
_ENV_UNSAFE_PARTS = re.compile(r"FILE|PLUGIN|DUMP|PATH|DIR|LIB|ADDR|PORT|IFNAME|HCA|COMM_ID|HOST|_ID$|UID")
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_.,:=/+-]{0,256}$")


def _check_env_value(kind: str, value: str) -> str | None:
    """Return why `value` is not acceptable for a variable of `kind`, or None."""
    if not _PLAIN_VALUE.fullmatch(value):
        return "may contain only letters, digits and _ . , : = / + - (at most 256 characters)"
    if kind == "positive_int":
        return None if value.isdigit() and 1 <= int(value) <= 1024 else "must be an integer from 1 to 1024"
    if kind == "port":
        return (
            None if value.isdigit() and 1024 <= int(value) <= 65535 else "must be a port from 1024 to 65535"
        )
    if kind == "zero_one":
        return None if value in ("0", "1") else "must be 0 or 1"
    if kind == "bool_word":
        return None if value.lower() in ("true", "false", "0", "1") else "must be true or false"
    if kind == "dist_debug":
        return None if value in ("OFF", "INFO", "DETAIL") else "must be OFF, INFO or DETAIL"
    if kind == "alloc_conf":
        ok = all(re.fullmatch(r"[a-z_]+:[A-Za-z0-9_.]+", part) for part in value.split(","))
        return None if ok else "must look like 'expandable_segments:True,max_split_size_mb:128'"
    return None


def env_variable_kind(name: str) -> str | None:
    """The value check for an allowed recipe variable, or None when the name is not allowed."""
    if name in _ENV_EXACT:
        return _ENV_EXACT[name]
    if (
        name.startswith(_ENV_PREFIXES)
        and re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", name)
        and not _ENV_UNSAFE_PARTS.search(name)
    ):
        return "plain"
    return None


def env_value_as_text(name: str, value: Any) -> str | None:
    """The text a variable given as a number or a boolean stands for (YAML and Compose users write
    `OMP_NUM_THREADS: 4` unquoted), for the fix: an environment holds only text. A boolean is "1" or
    "0", which every switch here reads (NCCL's parse an integer; the bool words take 0/1 too). None when
    that text would still be refused: a name not allowed, a value out of its range."""
    kind = env_variable_kind(name)
    if isinstance(value, bool):
        if kind not in ("bool_word", "zero_one", "plain"):  # a thread count or a port is no switch
            return None
        text = "1" if value else "0"
    elif isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        text = str(value)
    else:
        return None
    return text if kind is not None and _check_env_value(kind, text) is None else None


def _validate_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        kind = env_variable_kind(name)
        if kind is None:
            raise PydanticCustomError(
                "E006",
                "environment variable '{name}' is not allowed in a recipe; remove it. Allowed: "
                "OMP_NUM_THREADS, MKL_NUM_THREADS, TOKENIZERS_PARALLELISM, SHIRG_NO_DEVICE_MAP, MASTER_PORT, "
                "PYTORCH_CUDA_ALLOC_CONF, CUDA_LAUNCH_BLOCKING, TORCH_DISTRIBUTED_DEBUG, NCCL_* switches "
                "(not files, plugins, paths, addresses, ports, interfaces or ids), HF_HUB_OFFLINE-style hub switches; the launcher sets "
                "RANK/WORLD_SIZE/MASTER_ADDR itself",
                {"name": name[:80]},
            )
        problem = _check_env_value(kind, value)
        if problem:
            raise PydanticCustomError(
                "E006", "environment variable '{name}' {problem}", {"name": name, "problem": problem}
            )
    return env


class Recipe(StrictModel):
    """A training job: model, adapter, data, training knobs, resources, env, health, stages.

    With `entrypoint` it is a script job: the user's program runs instead of the trainer, and model,
    adapter, data and training, when given, only describe it to preflight.
    """

    name: Annotated[str, Field(min_length=1, max_length=200)]
    task: Literal["causal_lm", "masked_lm", "vision_language"] = Field(
        "causal_lm",
        description="causal_lm: question -> answer text; masked_lm: text lines; vision_language: image + "
        "question -> answer through the model's chat template and image processor.",
    )
    entrypoint: EntrypointSpec | None = Field(
        None,
        description="Run your own training script instead of the trainer (docs/own-script.md); model, "
        "adapter, data and training are then optional and used only by preflight.",
    )
    model: ModelSpec | None = Field(None, description="Required unless entrypoint is given.")
    adapter: AdapterSpec | None = Field(default_factory=AdapterSpec)
    data: DataSpec | None = Field(None, description="Required unless entrypoint is given.")
    training: TrainingSpec | None = Field(
        default_factory=TrainingSpec, description="A script job: only given to describe the run to preflight."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    env: dict[str, str] = Field(default_factory=dict, max_length=64)
    health: HealthSpec = Field(default_factory=HealthSpec)
    stages: list[dict[str, Any]] | None = Field(
        None,
        max_length=32,
        description="Partial recipes deep-merged over this one and run in order; "
        "model.path '@previous' loads the previous stage's output.",
    )

    @field_validator("env")
    @classmethod
    def _env_allowed(cls, env: dict[str, str]) -> dict[str, str]:
        return _validate_env(env)

    @model_validator(mode="before")
    @classmethod
    def _script_parts_only_when_given(cls, data: Any) -> Any:
        # The defaults describe the trainer's job (a LoRA adapter, bf16): a script's adapter and
        # precision are whatever the script does, so preflight must not judge the defaults.
        if isinstance(data, dict) and data.get("entrypoint") is not None:
            return {"adapter": None, "training": None, **data}
        return data

    @model_validator(mode="after")
    def _parts_for_the_job(self) -> Recipe:
        if self.entrypoint is None:
            missing = [part for part in RECIPE_PARTS if getattr(self, part) is None]
            if missing:
                raise PydanticCustomError(
                    "recipe_part_missing",
                    "required; add this field (or give an entrypoint to run your own script)",
                    {"paths": ",".join(missing)},
                )
        elif self.stages:
            raise PydanticCustomError(
                "recipe_part_missing",
                "a script job is one launch of your script; remove stages (run them inside the script)",
                {"paths": "stages"},
            )
        return self

    def need_model(self) -> ModelSpec:
        """`model`, for code that only runs on recipes that describe one (the trainer, the estimator)."""
        if self.model is None:
            raise ValueError("this recipe describes no model (a script job without model); add model")
        return self.model

    def need_data(self) -> DataSpec:
        """`data`, for code that only runs on recipes that describe it."""
        if self.data is None:
            raise ValueError("this recipe describes no data (a script job without data); add data")
        return self.data

    def need_training(self) -> TrainingSpec:
        """`training`, for code that only runs on recipes that describe it."""
        if self.training is None:
            raise ValueError(
                "this recipe describes no training (a script job without training); add training"
            )
        return self.training

    @property
    def is_script(self) -> bool:
        return self.entrypoint is not None

    @property
    def processes_per_node(self) -> int:
        """One process per GPU under DDP; one process for a device-mapped (model-parallel) model."""
        device_mapped = self.model is not None and self.model.device_map is not None
        return 1 if device_mapped else self.resources.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.processes_per_node * self.resources.nodes


def recipe_json_schema() -> dict[str, Any]:
    """The published JSON Schema (GET /recipes/schema, docs/recipe.md)."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Flightdeck recipe"
    # What the after-validator enforces, said in the schema: model and data, or an entrypoint.
    schema["anyOf"] = [
        {"required": ["model", "data"]},
        {"required": ["entrypoint"], "properties": {"entrypoint": {"type": "object"}}},
    ]
    return schema
