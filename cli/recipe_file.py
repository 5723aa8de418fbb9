"""A recipe file as the service takes it: JSON, or YAML by its name (.yaml, .yml), read as JSON's values.

YAML is read as YAML 1.2 (ruamel.yaml), not PyYAML's 1.1: to 1.1 a Slurm time `04:00:00` is the number
14400, `off` is false and `2e-4` a string. A key given twice is an error, as YAML says (JSON would keep
the last one).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

YAML_SUFFIXES = (".yaml", ".yml")


class RecipeFileError(ValueError):
    """The file cannot be read as a recipe; the message says where and why."""


def read_recipe_file(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecipeFileError(f"cannot read {path}: {exc.strerror}") from None
    if path.suffix.lower() in YAML_SUFFIXES:
        return _json_values(_load_yaml(path, text), "")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecipeFileError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def _load_yaml(path: Path, text: str) -> Any:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        return YAML(typ="safe", pure=True).load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise RecipeFileError(f"{path} is not valid YAML: {exc.problem or exc.context}{where}") from None
    except YAMLError as exc:
        raise RecipeFileError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None


def _json_values(value: Any, where: str) -> Any:
    """YAML's values as JSON's. A key must be text (`1: a` beside `"1": b` would become one key); a date
    or time (`name: 2026-11-29`) is its ISO text; a tagged value (`!!set`) its text."""
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                place = f" in {where}" if where else ""
                raise RecipeFileError(f'the key {key!r}{place} is not text: quote it ("{key}")')
        return {key: _json_values(item, f"{where}.{key}" if where else key) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_values(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, datetime.date):  # a datetime is a date too
        return value.isoformat()
    if value is None or isinstance(value, str | int | float):
        return value
    return str(value)
