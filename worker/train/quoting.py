"""How a data finding quotes what it read from a user's file: at most a short prefix, never the whole value.

A finding travels to the service, its database and every user who can read the job. A recipe may point
a data path at a file that is not a dataset (a key, a password file): were a finding to echo a row value
or a column name in full, it would turn preflight into a way of reading that file. Every data finding
(D001-D010, V001, V003) quotes values through `quote`, and only through it.
"""

from __future__ import annotations

from typing import Any

# Enough to recognise a column or a sample ("instruction", "What is the val"), too little to read a secret.
QUOTE_CHARS = 16


def quote(value: Any) -> str:
    """`value` as a quoted prefix of at most QUOTE_CHARS characters, '...' when it was cut."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= QUOTE_CHARS:
        return repr(text)
    return repr(text[:QUOTE_CHARS]) + "..."


def quote_all(values: Any, *, limit: int = 12) -> str:
    """A comma-separated list of quoted values, the first `limit` of them."""
    items = list(values)
    shown = ", ".join(quote(item) for item in items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")
