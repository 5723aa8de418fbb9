"""A finding: one problem (or correction) with its catalog code, severity, recipe path and fix."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from flightdeck.recipe.nul import FreeText, Identifier, clean_value

Severity = Literal["error", "fix", "warn"]
# A failure-catalog code: a letter and three digits (D001, G002, ...).
CODE_PATTERN = r"^[A-Z]\d{3}$"
CODE = re.compile(CODE_PATTERN)


class Finding(BaseModel):
    """What preflight, validation or a health check reports about a recipe or a run."""

    code: str | None = Field(
        None, description="Failure-catalog code (docs/failures.md) (D001, G002, ...) where one applies."
    )
    severity: Severity = "error"
    path: Identifier = Field(
        "", description="JSON path of the recipe field concerned, e.g. training.learning_rate."
    )
    message: FreeText = Field(description="What is wrong and what to change.")
    fix: FreeText | None = Field(
        None,
        description="For severity 'fix': the correction applied; for an error: the change to make, where "
        "it is one (the fix column of `flightdeck show`).",
    )
    value: Annotated[Any, AfterValidator(clean_value)] = Field(
        None, description="For severity 'fix': the new value written at `path`."
    )
    where: Literal["static", "host", "run"] = "static"


class FindingError(Exception):
    """Raised where a list of error findings must abort the current operation."""

    def __init__(self, findings: list[Finding]):
        super().__init__("; ".join(f"{f.code or 'invalid'} {f.path}: {f.message}" for f in findings))
        self.findings = findings
