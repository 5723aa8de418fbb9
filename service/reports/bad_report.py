"""A report an agent sent that cannot be stored: the route answers 422 with this message."""

from __future__ import annotations

# Rollup levels: bucket widths of 2**level steps (16 ... 65,536); each level is 4 times coarser.


class BadReport(ValueError):
    """A report body that cannot be stored; the message names the field and the fix."""
