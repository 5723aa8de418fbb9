"""Named parts of a vision-language model (vision_tower, projector, language_model) as module prefixes.

A recipe says `"freeze": ["vision_tower"]` or `"target_modules": ["language_model.q_proj"]` without
knowing how an architecture spells its modules; this table turns the part into the concrete prefix
(transformers 5.x names, before PEFT adds `base_model.model.`). No torch: the service uses it too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

PARTS = ("vision_tower", "projector", "language_model")

# model_type -> part -> regular expression over parameter / module names (anchored at the start).
_PART_PATTERNS: dict[str, dict[str, str]] = {
    # Qwen2-VL keeps its merger (the projector) inside `model.visual`.
    "qwen2_vl": {
        "vision_tower": r"^model\.visual\.(?!merger\.)",
        "projector": r"^model\.visual\.merger\.",
        "language_model": r"^(model\.language_model\.|lm_head\.)",
    },
    "llava": {
        "vision_tower": r"^model\.vision_tower\.",
        "projector": r"^model\.multi_modal_projector\.",
        "language_model": r"^(model\.language_model\.|lm_head\.)",
    },
}
_PART_PATTERNS["qwen2_5_vl"] = _PART_PATTERNS["qwen2_vl"]
# The module whose weights stage 2 must not quantise (V005): the tower and projector, full prefix.
_TOWER_MODULES: dict[str, tuple[str, ...]] = {
    "qwen2_vl": ("model.visual",),
    "qwen2_5_vl": ("model.visual",),
    "llava": ("model.vision_tower", "model.multi_modal_projector"),
}
VISION_LANGUAGE_TYPES = frozenset(_PART_PATTERNS)


def model_type_of(config: Mapping[str, Any] | None) -> str | None:
    return str(config.get("model_type")) if config and config.get("model_type") else None


def is_vision_language(config: Mapping[str, Any] | None) -> bool:
    """A config with a vision tower we know, or any config carrying a vision_config."""
    if not config:
        return False
    return model_type_of(config) in VISION_LANGUAGE_TYPES or isinstance(config.get("vision_config"), Mapping)


def part_pattern(model_type: str | None, part: str) -> str | None:
    """The prefix pattern of `part` for `model_type`, or None when the architecture is unknown."""
    return _PART_PATTERNS.get(model_type or "", {}).get(part)


def resolve_freeze(patterns: Sequence[str], model_type: str | None) -> list[str]:
    """Freeze patterns with part names replaced by the architecture's prefixes (others kept as given)."""
    resolved = []
    for pattern in patterns:
        concrete = part_pattern(model_type, pattern) if pattern in PARTS else None
        resolved.append(concrete or pattern)
    return resolved


def unresolved_parts(patterns: Sequence[str], model_type: str | None) -> list[str]:
    """Part names this architecture does not have (a text-only model asked to freeze 'vision_tower')."""
    return [p for p in patterns if p in PARTS and part_pattern(model_type, p) is None]


def split_target(target: str) -> tuple[str | None, str]:
    """'language_model.q_proj' -> ('language_model', 'q_proj'); 'q_proj' -> (None, 'q_proj')."""
    part, _, name = target.partition(".")
    return (part, name) if part in PARTS and name else (None, target)


def peft_target_modules(targets: Sequence[str] | str, model_type: str | None) -> list[str] | str:
    """PEFT's target_modules: a list of names, or one full-match regex when a target names a part."""
    if isinstance(targets, str) or all(split_target(t)[0] is None for t in targets):
        return targets if isinstance(targets, str) else list(targets)
    alternatives = []
    for target in targets:
        part, name = split_target(target)
        prefix = part_pattern(model_type, part) if part else None
        if part and prefix is None:
            raise ValueError(f"target '{target}': this model ({model_type}) has no part '{part}'")
        head = prefix.removeprefix("^") + ".*" if prefix else "(?:.*\\.)?"
        alternatives.append(head + re.escape(name))
    return "(?:" + "|".join(alternatives) + ")"  # PEFT full-matches a string target against each name


def target_matches(module_name: str, target: str, model_type: str | None) -> bool:
    """Whether a target_modules entry (plain or part-qualified) selects `module_name`."""
    part, name = split_target(target)
    if module_name != name and not module_name.endswith("." + name):
        return False
    prefix = part_pattern(model_type, part) if part else None
    return part is None or (prefix is not None and re.match(prefix, module_name + ".") is not None)


def tower_modules(model_type: str | None) -> tuple[str, ...]:
    """Full module prefixes of the vision tower (and projector) that 4-bit loading must skip (V005)."""
    return _TOWER_MODULES.get(model_type or "", ())


def skips_tower(skip: Sequence[str], model_type: str | None) -> bool:
    """Whether a 4-bit skip list means to keep the tower in full precision ('vision_tower', 'model.visual',
    or a short name such as 'visual' that transformers will not match: V005 checks that after load)."""
    tower = tower_modules(model_type)
    return any(
        name == "vision_tower" or any(t == name or t.endswith("." + name) for t in tower) for name in skip
    )


def task_mismatch(task: str, config: Mapping[str, Any]) -> str | None:
    """Why `task` cannot train the model whose config.json this is (a vision-language checkpoint under a
    text task fails to load with 'Unrecognized configuration class'), or None."""
    vision, model_type = is_vision_language(config), config.get("model_type")
    if vision and task != "vision_language":
        return (
            f"the model at model.path is a vision-language model ({model_type}) but task is '{task}': it "
            "would fail to load ('Unrecognized configuration class'). Set task to 'vision_language' and "
            "give data sources with an image field"
        )
    if task == "vision_language" and not vision:
        return (
            f"task 'vision_language' needs a vision-language model; the model at model.path is {model_type} "
            "(text only). Use task 'causal_lm', or a Qwen2-VL / LLaVA checkpoint"
        )
    return None
