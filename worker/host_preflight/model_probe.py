"""The model as the host sees it: config.json, module names built on the meta device, the tokenizer.

Host rules G006 (target modules exist), D006 (sequence vs positions), X002 (fp16 on a bf16 model) and
G009 (pad token). No weights are read: the model is instantiated on torch's meta device.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightdeck.preflight.environment_rules import capped_sequence
from flightdeck.preflight.rule_result import RuleResult, correction, error, warn
from flightdeck.recipe.model_parts import (
    PARTS,
    is_vision_language,
    model_type_of,
    part_pattern,
    resolve_freeze,
    target_matches,
    task_mismatch,
    tower_modules,
    unresolved_parts,
)
from flightdeck.recipe.schema import PREVIOUS_STAGE, Recipe
from flightdeck.worker.path_confinement import model_location

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
    image_processor: Any = None  # vision_language only
    embedding_rows: int | None = None  # rows of the input embedding table (G013)
    accepts_loss_kwargs: bool = True  # whether the Trainer passes num_items_in_batch to forward (G015)

    @property
    def model_type(self) -> str | None:
        return model_type_of(self.config)


def build_on_meta(config: Any, task: str) -> Any:
    """Instantiate the architecture with no storage (every tensor on the meta device)."""
    import torch
    from transformers import AutoModel

    from flightdeck.worker.train.model import model_factory

    with torch.device("meta"):
        try:
            return model_factory(task).from_config(config)
        except ValueError:  # e.g. a vision-language config under task causal_lm (reported by wrong_task)
            return AutoModel.from_config(config)  # type: ignore[no-untyped-call]


def probe_model(recipe: Recipe, workspace: Path) -> ModelProbe:
    """Read config.json and the tokenizer, and list linear modules of the meta-device model."""
    import torch
    from transformers import AutoConfig, AutoTokenizer
    from transformers.pytorch_utils import Conv1D

    location = model_location(recipe.need_model().path, workspace)
    config = AutoConfig.from_pretrained(location)
    model = build_on_meta(config, recipe.task)
    linear_names = [
        name for name, module in model.named_modules() if isinstance(module, (torch.nn.Linear, Conv1D))
    ]
    count = sum(p.numel() for p in model.parameters())
    from flightdeck.worker.host_preflight.vocabulary_rules import embedding_rows
    from flightdeck.worker.train.loss_kwargs import accepts_loss_kwargs

    raw = Path(location) / "config.json"
    config_dict = json.loads(raw.read_text()) if raw.is_file() else config.to_dict()
    tokenizer = AutoTokenizer.from_pretrained(location)
    image_processor = None
    if recipe.task == "vision_language" and is_vision_language(config_dict):
        from transformers import AutoImageProcessor

        max_pixels = recipe.data.max_pixels if recipe.data is not None else None
        kwargs = {"max_pixels": max_pixels} if max_pixels else {}
        image_processor = AutoImageProcessor.from_pretrained(location, **kwargs)
    return ModelProbe(
        image_processor=image_processor,
        directory=Path(location),
        config=config_dict,
        linear_names=linear_names,
        parameter_count=count,
        pad_token=tokenizer.pad_token,
        tokenizer=tokenizer,
        embedding_rows=embedding_rows(model),
        accepts_loss_kwargs=accepts_loss_kwargs(model),
    )


def image_text_processor(probe: ModelProbe | None) -> Any:
    """The trainer's image-text processor over the probed tokenizer and image processor (None if text)."""
    from flightdeck.worker.train.image_text import ImageTextProcessor, processor_chat_template

    if probe is None or probe.image_processor is None:
        return None
    if probe.tokenizer.chat_template is None:
        probe.tokenizer.chat_template = processor_chat_template(probe.directory)
    if probe.tokenizer.chat_template is None:
        return None
    return ImageTextProcessor(probe.tokenizer, probe.image_processor, probe.config)


# The parts only an image runs through: a batch without one leaves all of them without gradients (V003).
IMAGE_PATH_PARTS = ("vision_tower", "projector")


def tower_trains(recipe: Recipe, probe: ModelProbe | None) -> bool:
    """Whether some parameter of the vision tower or the projector will receive gradients (full fine-tune
    or LoRA in them). The projector counts too: Qwen2-VL's merger or LLaVA's multi_modal_projector is a
    part of its own, and it sits idle in an image-less batch just like the tower."""
    if probe is None:
        return False
    prefixes = [p for p in (part_pattern(probe.model_type, part) for part in IMAGE_PATH_PARTS) if p]
    tower = [name for name in probe.linear_names if any(re.match(p, name + ".") for p in prefixes)]
    if recipe.adapter is not None:
        targets = recipe.adapter.target_modules
        # modules_to_save trains a whole module (LLaVA recipes often save multi_modal_projector).
        saved = any(f".{m}." in f".{name}." for m in recipe.adapter.modules_to_save for name in tower)
        if targets == "all-linear":
            return bool(tower)
        return saved or any(target_matches(name, t, probe.model_type) for name in tower for t in targets)
    freeze = [re.compile(p) for p in resolve_freeze(recipe.model.freeze, probe.model_type)]
    return any(not any(p.search(name + ".weight") for p in freeze) for name in tower)


def candidate_targets(linear_names: list[str]) -> list[str]:
    """Short names usable in target_modules (the last component of each non-head linear)."""
    names = {name.rsplit(".", 1)[-1] for name in linear_names if not name.endswith(HEAD_NAMES)}
    return sorted(names)


def missing_targets(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """G006: target_modules that match no linear module of the model."""
    if recipe.adapter is None or recipe.adapter.target_modules == "all-linear":
        return []
    missing = [
        t
        for t in recipe.adapter.target_modules
        if not any(target_matches(n, t, probe.model_type) for n in probe.linear_names)
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


def sequence_beyond_positions(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """D006 against the real model's position table."""
    return capped_sequence(recipe, _position_limit(probe.config), "host")


def fp16_on_bf16_model(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """X002: fp16 training of a model pretrained in bf16 overflows (NaN or zero loss)."""
    dtype = probe.config.get("torch_dtype") or probe.config.get("dtype")
    if recipe.training is None or recipe.training.precision != "fp16" or dtype != "bfloat16":
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


def missing_pad_token(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """G009: a tokenizer without a pad token cannot pad batches."""
    from flightdeck.worker.train.model import reusable_pad_token

    if probe.pad_token is not None or recipe.model.path == PREVIOUS_STAGE:
        return []
    problem = (
        "the tokenizer has no pad token ('Asking to pad but the tokenizer does not have a padding token')."
    )
    reuse = reusable_pad_token(probe.tokenizer) if probe.tokenizer is not None else None
    if reuse is not None:
        return [
            correction(
                "G009",
                "model.path",
                problem,
                f"the trainer pads with the tokenizer's existing {reuse!r} (not eos: the model must learn to "
                "stop; no new token, so nothing an adapter could lose on reload)",
                where="host",
            )
        ]
    if recipe.adapter is None:
        return [correction("G009", "model.path", problem, "the trainer adds a '<pad>' token", where="host")]
    from flightdeck.worker.train.model import PAD_TOKEN_MODULES

    # Written into the effective recipe, so the run's recipe.json and the memory estimate (M001) show
    # the embeddings that train.
    saved = list(dict.fromkeys([*recipe.adapter.modules_to_save, *PAD_TOKEN_MODULES]))
    return [
        correction(
            "G011",
            "adapter.modules_to_save",
            problem + " No spare special token exists, so one must be added while an adapter trains: a "
            "LoRA adapter saves no embedding rows and the new row would be lost on reload.",
            "the trainer adds '<pad>' and trains and saves embed_tokens and lm_head with the adapter "
            f"(adapter.modules_to_save is now {saved})",
            {"adapter.modules_to_save": saved},
            where="host",
        )
    ]


def wrong_task(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """A vision-language checkpoint under a text task (or the reverse) fails at load; name `task`."""
    problem = task_mismatch(recipe.task, probe.config)
    return [error(None, "task", problem, "host")] if problem else []


def named_parts(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """model.freeze's part names (vision_tower, ...) written as this architecture's module prefixes, so the
    effective recipe shows what is frozen; no catalog code: a resolution, not a failure."""
    resolved = resolve_freeze(recipe.model.freeze, probe.model_type)
    if resolved == recipe.model.freeze or unresolved_parts(recipe.model.freeze, probe.model_type):
        return []
    named = [p for p in recipe.model.freeze if p in PARTS]
    return [
        correction(
            None,
            "model.freeze",
            f"{', '.join(named)} resolved for this {probe.model_type} model.",
            f"model.freeze set to {resolved}",
            {"model.freeze": resolved},
            "host",
        )
    ]


def unknown_parts(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """A named part (vision_tower, ...) the architecture does not have, in freeze or the 4-bit skip list."""
    missing = unresolved_parts(recipe.model.freeze, probe.model_type)
    if not missing:
        return []
    return [
        error(
            None,
            "model.freeze",
            f"{missing} are named parts of vision-language models; this model ({probe.model_type}) has none "
            f"we know. Use regular expressions over its parameter names instead (parts: {', '.join(PARTS)})",
            "host",
        )
    ]


def views_the_tower_cannot_take(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """V002: the image processor's output does not match what the model's vision config expects."""
    from flightdeck.worker.train.image_text import view_mismatch

    if probe.image_processor is None:
        return []
    problem = view_mismatch(probe.config, probe.image_processor)
    return [error("V002", "model.path", problem, "host")] if problem else []


def missing_chat_template(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """vision_language places images through the chat template; a checkpoint without one cannot train."""
    if probe.image_processor is None or image_text_processor(probe) is not None:
        return []
    return [
        error(
            None,
            "model.path",
            "the model has no chat template (tokenizer_config.json, chat_template.jinja or "
            "chat_template.json): vision_language needs one to place the image tokens. Save the model's "
            "processor or tokenizer with its chat template",
            "host",
        )
    ]


def short_quantisation_skip(recipe: Recipe, probe: ModelProbe) -> list[RuleResult]:
    """V005: a 4-bit skip entry that is not the tower's full prefix ('visual' for 'model.visual') skips nothing."""
    skip = recipe.model.quantization_skip_modules
    tower = tower_modules(probe.model_type)
    if not recipe.model.quantization or not skip or not tower:
        return []
    short = [
        name
        for name in skip
        if name != "vision_tower" and name not in tower and any(t.endswith("." + name) for t in tower)
    ]
    if not short:
        return []
    fixed = [name for name in skip if name not in short] + ["vision_tower"]
    return [
        correction(
            "V005",
            "model.quantization_skip_modules",
            f"{short} is not a module prefix of this {probe.model_type} model (its tower is "
            f"{', '.join(tower)}): transformers matches skip entries from the start of the name, so the tower "
            "would be quantised and what the previous stage trained would be lost.",
            f"skip list set to {fixed} ('vision_tower' = {', '.join(tower)}); verified after load",
            {"model.quantization_skip_modules": list(dict.fromkeys(fixed))},
            "host",
        )
    ]


MODEL_RULES = (
    wrong_task,
    unknown_parts,
    named_parts,
    missing_targets,
    sequence_beyond_positions,
    fp16_on_bf16_model,
    missing_pad_token,
    views_the_tower_cannot_take,
    missing_chat_template,
    short_quantisation_skip,
)
