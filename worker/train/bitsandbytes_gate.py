"""Keep bitsandbytes out of a recipe's ranks when nothing in the run uses it.

transformers' Trainer imports peft, and peft imports bitsandbytes whenever it is installed. That import
costs about 1.5 s of every rank's start here (bench/README.md, "A recipe rank's imports"), for a run
that neither quantises its model, nor picks an 8-bit optimizer, nor loads a checkpoint saved quantised.
(The rank's spawned DataLoader workers import neither: worker/train/loader_seed.py.) A None in
`sys.modules` is Python's documented way to make a module unimportable: `importlib.util.find_spec` then
answers None, so transformers and peft take bitsandbytes for not installed and skip it. Whenever this
module cannot tell (a recipe it cannot parse, a model whose config.json it cannot read), bitsandbytes
stays importable: the gate may only cost time, never a run.

Light on purpose (json, pathlib, the recipe schema): it runs before the trainer's imports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flightdeck.recipe import Recipe, expand_stages, parse_recipe
from flightdeck.recipe.schema import PREVIOUS_STAGE
from flightdeck.run_variables import run_workspace
from flightdeck.worker.path_confinement import model_location

# transformers' names for the optimizers bitsandbytes implements (the schema's training.optimizer).
BITSANDBYTES_OPTIMIZERS = frozenset({"adamw_8bit", "paged_adamw_8bit"})


def _saved_quantization(location: str) -> str | None:
    """Why this model's checkpoint may need bitsandbytes (its config.json declares a quantization, or
    cannot be read here); None when its config.json says nothing of one."""
    config = Path(location) / "config.json"
    if not Path(location).is_dir():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(location, "config.json")
        except Exception:  # not a hub id the cache knows how to look up
            cached = None
        if not isinstance(cached, str):
            return f"{location}: config.json is not in the local hub cache"
        config = Path(cached)
    try:
        declared = json.loads(config.read_text(encoding="utf-8")).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        return f"{config}: not readable as a JSON object"
    if declared:
        method = declared.get("quant_method", "?") if isinstance(declared, dict) else "?"
        return f"{config}: saved quantised (quantization_config, quant_method {method})"
    return None


def bitsandbytes_use(stages: list[Recipe], workspace: Path) -> str | None:
    """What in the run may call bitsandbytes, or None when nothing does."""
    for stage in stages:
        model = stage.need_model()
        if model.quantization is not None:
            return f"model.quantization {model.quantization}"
        if stage.training is not None and stage.training.optimizer in BITSANDBYTES_OPTIMIZERS:
            return f"training.optimizer {stage.training.optimizer}"
        # A later stage's "previous" model is an earlier stage's output: quantised only if that stage was.
        if model.path != PREVIOUS_STAGE:
            saved = _saved_quantization(str(model_location(model.path, workspace)))
            if saved is not None:
                return saved
    return None


def keep_bitsandbytes_out_unless_used(recipe_path: Path) -> bool:
    """Make bitsandbytes unimportable in this process when the recipe at `recipe_path` cannot use it.

    True when it was kept out. Call before anything imports transformers' Trainer or peft.
    """
    if "bitsandbytes" in sys.modules:  # already imported (or already kept out): nothing to decide
        return sys.modules["bitsandbytes"] is None
    try:
        stages = expand_stages(parse_recipe(json.loads(recipe_path.read_text(encoding="utf-8"))))
        used = bitsandbytes_use(stages, run_workspace())
    except Exception:  # the trainer reports a recipe it cannot read, with the field and the fix
        return False
    if used is not None:
        return False
    sys.modules["bitsandbytes"] = None  # type: ignore[assignment]
    return True
