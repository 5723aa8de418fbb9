"""Turn a submitted JSON object into a Recipe, or into every problem with it at once."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from flightdeck.recipe.findings import CODE, Finding
from flightdeck.recipe.near_keys import (
    ALWAYS_DONE,
    home_section,
    inner_home,
    misspelling,
    move_fix,
    not_set_fix,
    other_tools_name,
    places,
    rename_fix,
    section_as_one_value,
    value_fix,
)
from flightdeck.recipe.peft_config import is_peft_config, peft_config_finding
from flightdeck.recipe.schema import PREVIOUS_STAGE, Recipe, env_value_as_text

_STAGE_KEYS = set(Recipe.model_fields) - {"stages"}
# The deepest a recipe goes is about 6 levels; stages are merged recursively, so a deeper body is
# refused before any merge or validation (500 nested objects once raised RecursionError).
MAX_RECIPE_DEPTH = 32
# What the launch plan is built from: one torchrun per job, so no stage may change it.
LAUNCH_KEYS = {"resources", "env", "entrypoint"}


class RecipeInvalid(Exception):
    """The recipe was refused; `findings` lists every problem, each with its path."""

    def __init__(self, findings: list[Finding]):
        super().__init__(f"{len(findings)} problem(s) in the recipe")
        self.findings = findings


def json_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """('data', 'train', 0, 'path') -> 'data.train[0].path'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key; remove it or fix its spelling (see GET /recipes/schema)"
    if kind == "missing":
        return "required; add this field"
    if kind == "model_type":  # pydantic names the class ('AdapterSpec'); the user wrote an object's key
        return f"must be an object of settings (GET /recipes/schema); got {_short(error.get('input'))}"
    if kind in ("literal_error", "enum"):
        return f"{error['msg'].replace('Input should be', 'must be')}; got {_short(error.get('input'))}"
    msg = str(error["msg"])
    msg = msg.replace("Input should be", "must be").replace("Value error, ", "")
    return f"{msg}; got {_short(error.get('input'))}" if "input" in error and kind != "dict_type" else msg


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _moved(key: str, sections: set[str], where: str, value: Any, in_stage: bool) -> tuple[str, str] | None:
    """The message and fix for an unknown key `where` that is a key of one of `sections`; the fix
    removes it instead where `value` is another tool's "not set" (a flat `max_steps: -1`)."""
    home = home_section(key, sorted(sections))
    # `path` out of place may be the model's or a data source's; another tool's name (`base_model`) is not.
    if home is None or (home[1] == key and places(key) > 1):
        return None
    section, name = home
    fix = not_set_fix((section, name), value, in_stage=in_stage) or move_fix(key, section, name, value)
    return f"unknown key {where}; '{key}' belongs in '{section}' ('{section}.{name}')", fix


def _inner(section: str, key: str, where: str) -> tuple[str, str] | None:
    """The message and fix for a key of an object inside `section` given `where` (in the section
    itself, or flat at the top level): a data source's `path` or `max_samples` in `data` belongs in
    each source of `data.train`."""
    home = inner_home(section, key)
    if home is None:
        return None
    name, listed = home
    if not listed:
        return (
            f"unknown key {where}; '{key}' belongs in '{section}.{name}'",
            f"move '{key}' into '{section}.{name}'",
        )
    return (
        f"unknown key {where}; '{key}' is a key of each entry of '{section}.{name}'",
        f'move \'{key}\' into each entry: "{section}": {{"{name}": [{{"{key}": ...}}]}}',
    )


def _unknown_key(
    loc: tuple[int | str, ...], value: Any, sections: set[str], in_stage: bool
) -> tuple[str, str] | None:
    """The message and fix for an unknown key at `loc` (in the recipe) holding `value`: one of
    Flightdeck's built-in behaviours, another tool's name for a key here, a key in the wrong place, or a
    typo."""
    key = str(loc[-1])
    if key.lower() in ALWAYS_DONE:
        return f"unknown key: {ALWAYS_DONE[key.lower()]}", "remove it"
    near = other_tools_name(loc, value)
    if near is None:
        if placed := _misplaced(loc, value, sections, in_stage):
            return placed
        near = misspelling(loc, value)
    if near is None:
        return None
    message = f"unknown key; did you mean '{near}'? (the keys allowed here: GET /recipes/schema)"
    return message, rename_fix(key, near, value)


def _misplaced(
    loc: tuple[int | str, ...], value: Any, sections: set[str], in_stage: bool
) -> tuple[str, str] | None:
    """Where a key out of place belongs, among `sections`: a flat config's key at the top level
    (`learning_rate`, or a data source's `max_samples`), another section's key in a section
    (TrainingArguments' `gradient_checkpointing` in `training` is `model`'s), or a key of what a section
    holds given in the section itself (a data source's `path` in `data`)."""
    key = str(loc[-1])
    if len(loc) == 1:
        if moved := _moved(key, sections, "at the top level", value, in_stage):
            return moved
        if places(key) != 1:  # `path` may be the model's or a source's
            return None
        return next(filter(None, (_inner(name, key, "at the top level") for name in sorted(sections))), None)
    section = str(loc[0])
    if len(loc) != 2 or section not in sections:
        return None
    where = f"in '{section}'"
    return _inner(section, key, where) or _moved(key, sections - {section}, where, value, in_stage)


def findings_from_validation(exc: ValidationError, prefix: tuple[int | str, ...] = ()) -> list[Finding]:
    recipe = exc.title == Recipe.__name__
    findings = []
    for error in exc.errors(include_url=False):
        loc = prefix + tuple(error["loc"])
        # pydantic puts the union member's tag in the location (e.g. 'list[...]'); hide it.
        loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("literal"))))
        if error["type"] == "recipe_part_missing":
            # Raised once for the whole recipe: one finding per part it names, at that part's path.
            for part in str(error.get("ctx", {}).get("paths", "")).split(","):
                findings.append(Finding(path=json_path((*loc, part)), message=str(error["msg"])))
            continue
        code = error["type"] if CODE.fullmatch(error["type"]) else None
        message = _message(error) if code is None else str(error["msg"])
        fix = None
        bare, value = loc[len(prefix) :], error.get("input")
        if error["type"] == "extra_forbidden" and recipe:
            # In a stage, a key moves only where a stage may set it.
            sections = _STAGE_KEYS - LAUNCH_KEYS if prefix else _STAGE_KEYS
            message, fix = _unknown_key(bare, value, sections, bool(prefix)) or (message, fix)
        elif error["type"] == "model_type" and len(bare) == 1:
            fix = section_as_one_value(str(bare[0]), value, in_stage=bool(prefix))
        elif len(bare) == 2 and bare[0] == "env" and (text := env_value_as_text(str(bare[1]), value)):
            message = f"must be text: an environment holds only strings; got {_short(value)}"
            fix = f'give it as text: "{bare[1]}": "{text}"'
        elif error["type"] in ("literal_error", "enum") and bare:
            fix = value_fix(str(bare[-1]), value)
        elif code is None:
            fix = not_set_fix(bare, value, in_stage=bool(prefix))
        if code == "E006":  # the check runs on the whole mapping; point at the variable itself
            loc = (*loc, str(error.get("ctx", {}).get("name", "")))
        findings.append(Finding(code=code, severity="error", path=json_path(loc), message=message, fix=fix))
    return findings


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Dicts merge key by key; anything else (lists included) is replaced by the override."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _device_map_findings(base: dict[str, Any], stage: dict[str, Any], index: int) -> list[Finding]:
    """A stage whose device map differs from the base would run in the base's process layout (P001)."""
    model = stage.get("model")
    if not isinstance(model, dict) or "device_map" not in model:
        return []
    base_model = base.get("model")
    base_map = base_model.get("device_map") if isinstance(base_model, dict) else None
    if model["device_map"] == base_map:
        return []
    return [
        Finding(
            code="P001",
            path=f"stages[{index}].model.device_map",
            message=f"this stage sets device_map {model['device_map']!r} but the job launches the processes "
            f"of the top-level recipe (device_map {base_map!r}); all stages share one launch. Use the same "
            "device_map in every stage, drop it (DDP with per-rank placement for 4-bit, P006), or submit "
            "this stage as its own job with model.path set to the previous job's output",
        )
    ]


def _stray_stage_key(key: str, value: Any) -> tuple[str, str | None]:
    """The message and fix for a key a stage may not hold: one of a section's keys (a stage's own, or
    a launch setting that only the top level sets), or none."""
    moved = _moved(key, _STAGE_KEYS - LAUNCH_KEYS, "in a stage", value, True)
    if moved is not None:
        return moved
    launch = home_section(key, sorted(LAUNCH_KEYS))
    if launch is None:
        return "unknown key in a stage; remove it", None
    section, name = launch
    return (
        f"unknown key in a stage; '{key}' belongs in '{section}' ('{section}.{name}'), which only the top "
        "level sets: all stages run in the job's one launch",
        f"at the top level: {move_fix(key, section, name)}; or submit this stage as a job of its own",
    )


def _stage_findings(payload: dict[str, Any], base_paths: set[str]) -> list[Finding]:
    stages = payload.get("stages")
    if not isinstance(stages, list):
        return []
    base = {k: v for k, v in payload.items() if k != "stages"}
    findings: list[Finding] = []
    for index, stage in enumerate(stages):
        if not isinstance(stage, dict):
            findings.append(Finding(path=f"stages[{index}]", message="each stage must be an object"))
            continue
        for key in stage:
            if key not in _STAGE_KEYS:
                message, fix = _stray_stage_key(key, stage[key])
                findings.append(Finding(path=f"stages[{index}].{key}", message=message, fix=fix))
            elif key in LAUNCH_KEYS:
                findings.append(
                    Finding(
                        path=f"stages[{index}].{key}",
                        message=f"all stages run in the job's one launch; set {key} at the top level, "
                        "or submit this stage as a job of its own",
                    )
                )
        findings.extend(_device_map_findings(base, stage, index))
        model = stage.get("model")
        uses_previous = isinstance(model, dict) and model.get("path") == PREVIOUS_STAGE
        if uses_previous and index == 0:
            findings.append(
                Finding(
                    path="stages[0].model.path",
                    message="'@previous' needs a previous stage; give the first stage a real model path",
                )
            )
        try:
            Recipe.model_validate(deep_merge(base, {k: v for k, v in stage.items() if k in _STAGE_KEYS}))
        except ValidationError as exc:
            prefix = f"stages[{index}]."
            # A problem the base recipe already reports would be repeated once per stage.
            findings.extend(
                f
                for f in findings_from_validation(exc, ("stages", index))
                if f.path.removeprefix(prefix) not in base_paths
            )
    return findings


def _with_peft_configs(payload: dict[str, Any], findings: list[Finding]) -> list[Finding]:
    """An adapter (the top level's or a stage's) that is peft's saved adapter_config.json gets one finding
    with the adapter it stands for, in place of the findings under it."""
    stages = payload.get("stages")
    places = {"adapter": payload.get("adapter")}
    if isinstance(stages, list):
        places |= {
            f"stages[{i}].adapter": s.get("adapter") for i, s in enumerate(stages) if isinstance(s, dict)
        }
    configs = {path: config for path, config in places.items() if is_peft_config(config)}
    if not configs:
        return findings
    kept = [f for f in findings if not any(f.path == p or f.path.startswith(p + ".") for p in configs)]
    return kept + [peft_config_finding(path, config) for path, config in configs.items()]


def shape_findings(payload: Any) -> list[Finding]:
    """Nesting beyond MAX_RECIPE_DEPTH (then nothing else is looked at), and NUL in any key or string:
    no recipe field has a use for NUL, and PostgreSQL text cannot hold it, so both databases refuse it."""
    findings: list[Finding] = []
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(payload, ())]
    while stack:
        value, loc = stack.pop()
        if len(loc) > MAX_RECIPE_DEPTH:
            message = f"nested deeper than {MAX_RECIPE_DEPTH} levels; a recipe needs fewer than 10"
            return [Finding(path=json_path(loc[:MAX_RECIPE_DEPTH]), message=message)]
        if isinstance(value, dict):
            for key, item in value.items():
                if "\x00" in key:
                    findings.append(_nul_finding((*loc, key.replace("\x00", "\\0"))))
                stack.append((item, (*loc, key)))
        elif isinstance(value, list):
            stack.extend((item, (*loc, index)) for index, item in enumerate(value))
        elif isinstance(value, str) and "\x00" in value:
            findings.append(_nul_finding(loc))
    return findings


def _nul_finding(loc: tuple[int | str, ...]) -> Finding:
    return Finding(path=json_path(loc), message="contains a NUL character (\\u0000); remove it")


def parse_recipe(payload: Any) -> Recipe:
    """Validate a submitted recipe (stages included), raising RecipeInvalid with every problem."""
    if not isinstance(payload, dict):
        raise RecipeInvalid([Finding(path="", message="the recipe must be a JSON object")])
    findings = shape_findings(payload)
    if findings:
        raise RecipeInvalid(findings)
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(payload)
    except ValidationError as exc:
        findings.extend(findings_from_validation(exc))
    model = payload.get("model")
    if isinstance(model, dict) and model.get("path") == PREVIOUS_STAGE:
        findings.append(
            Finding(
                path="model.path",
                message="'@previous' is only allowed in stages from the second on; use a real model path",
            )
        )
    findings.extend(_stage_findings(payload, {f.path for f in findings}))
    findings = _with_peft_configs(payload, findings)
    if findings or recipe is None:
        raise RecipeInvalid(findings)
    return recipe


def planned_steps(recipe: Recipe) -> int | None:
    """The optimizer steps the whole job plans (every stage has max_steps), or None when epochs decide."""
    steps = [stage.training.max_steps if stage.training else None for stage in expand_stages(recipe)]
    return None if None in steps else sum(s for s in steps if s is not None)


def expand_stages(recipe: Recipe) -> list[Recipe]:
    """The recipes to run in order: the recipe itself, or each stage merged over it."""
    if not recipe.stages:
        return [recipe]
    base = recipe.model_dump(mode="json", exclude={"stages"})
    return [Recipe.model_validate(deep_merge(base, stage) | {"stages": None}) for stage in recipe.stages]
