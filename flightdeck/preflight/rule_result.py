"""What a rule returns: a finding, or a correction (a 'fix' finding plus the recipe changes it makes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from flightdeck.memory.architecture import ModelShape
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import Recipe

Where = Literal["static", "host", "run"]


@dataclass(frozen=True)
class Correction:
    """A 'fix' finding plus the recipe changes (path -> value); empty when the trainer or agent applies it."""

    finding: Finding
    changes: dict[str, Any] = field(default_factory=dict)


RuleResult = Finding | Correction
StaticRule = Callable[[Recipe, ModelShape | None], list[RuleResult]]


def error(
    code: str | None, path: str, message: str, where: Where = "static", fix: str | None = None
) -> Finding:
    return Finding(code=code, severity="error", path=path, message=message, where=where, fix=fix)


def warn(code: str, path: str, message: str, where: Where = "static") -> Finding:
    return Finding(code=code, severity="warn", path=path, message=message, where=where)


def correction(
    code: str | None,
    path: str,
    message: str,
    fix: str,
    changes: dict[str, Any] | None = None,
    where: Where = "static",
) -> Correction:
    """A fix; `value` records the new value (or every change when there are several)."""
    changes = changes or {}
    value: Any = None
    if len(changes) == 1:
        value = next(iter(changes.values()))
    elif changes:
        value = dict(changes)
    finding = Finding(
        code=code, severity="fix", path=path, message=message, fix=fix, value=value, where=where
    )
    return Correction(finding, changes)
