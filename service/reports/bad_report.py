"""A report an agent sent that cannot be stored: the route answers 422 with this message."""

from __future__ import annotations


class BadReport(ValueError):
    """A report body that cannot be stored; the message names the field and the fix."""
