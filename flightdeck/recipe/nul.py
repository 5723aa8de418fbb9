"""NUL in text: one rule on both databases.

PostgreSQL text cannot hold NUL and SQLite can: without one rule, a run whose log held a NUL byte
succeeded on SQLite and failed on PostgreSQL. Free text is cleaned (a run's outcome never depends on
its log's bytes); identifiers are refused with 422, since a cleaned name would name something else.
Recipes are refused whole when any string holds NUL (flightdeck/recipe/validate.py).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

NUL_REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """Free text with every NUL replaced, as an undecodable byte is."""
    return text.replace("\x00", NUL_REPLACEMENT) if "\x00" in text else text


def clean_value(value: Any) -> Any:
    """`value` with NUL replaced in every string and key, recursively (event data, finding values)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_value(v) for v in value]
    return value


def _refuse_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("contains a NUL character; names and keys cannot hold one, remove it")
    return text


# Messages, fixes, log tails, failure texts: NUL replaced.
FreeText = Annotated[str, AfterValidator(clean_text)]
# Keys, kinds, classes, codes, paths: NUL refused (422 naming the field).
Identifier = Annotated[str, AfterValidator(_refuse_nul)]
