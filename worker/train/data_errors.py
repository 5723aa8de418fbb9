"""DataSourceError: a data source cannot be read as the recipe describes; `code` is the docs/failures.md code."""

from __future__ import annotations

import re
from collections.abc import Sequence

_CODED_TEXT = re.compile(r"([A-Z]\d{3}): (.*)", re.DOTALL)
# How the fix is written after the message in the error's text, so that a rebuilt error keeps it apart.
FIX_MARK = "\nfix: "


class DataSourceError(Exception):
    """A data source cannot be read as the recipe describes; `code` is the docs/failures.md code.

    `DataSourceError(text)` (one string) rebuilds the error from its text: how PyTorch re-raises an
    exception of a DataLoader worker in the main process (`type(text)`, text ending with the worker's
    traceback, `...DataSourceError: V001: ...`) and how pickle rebuilds it. Without that the collator's
    code was lost: the rebuild failed and PyTorch raised a plain RuntimeError (an uncoded failure).
    The text ends with the fix on a line of its own (FIX_MARK): the rebuild reads it back into `fix`, so
    a loader worker's data error still reaches the attempt's failure with its fix in the fix field.
    """

    def __init__(
        self,
        code: str | None,
        message: str | None = None,
        *,
        available_fields: Sequence[str] = (),
        available_splits: Sequence[str] = (),
        fix: str | None = None,
    ):
        if message is None:  # rebuilt from text: "[...DataSourceError: ][CODE: ]message"
            text = (code or "").rpartition(f"{type(self).__name__}: ")[2].strip()
            coded = _CODED_TEXT.fullmatch(text)
            code, message = (coded.group(1), coded.group(2)) if coded else (None, text)
            message, _, told = message.partition(FIX_MARK)
            fix = told.strip() or None
        text = f"{code}: {message}" if code else message
        super().__init__(text + (f"{FIX_MARK}{fix}" if fix else ""))
        self.code = code
        self.message = message
        self.available_fields = list(available_fields)
        self.available_splits = list(available_splits)
        # The change to make, shown in a finding's fix column and the attempt's failure_fix.
        self.fix = fix
