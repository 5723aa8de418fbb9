"""DataSourceError: a data source cannot be read as the recipe describes; `code` is the docs/failures.md code."""

from __future__ import annotations

import re
from collections.abc import Sequence

_CODED_TEXT = re.compile(r"([A-Z]\d{3}): (.*)", re.DOTALL)


class DataSourceError(Exception):
    """A data source cannot be read as the recipe describes; `code` is the docs/failures.md code.

    `DataSourceError(text)` (one string) rebuilds the error from its text: how PyTorch re-raises an
    exception of a DataLoader worker in the main process (`type(text)`, text ending with the worker's
    traceback, `...DataSourceError: V001: ...`) and how pickle rebuilds it. Without that the collator's
    code was lost: the rebuild failed and PyTorch raised a plain RuntimeError (an uncoded failure).
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
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message
        self.available_fields = list(available_fields)
        self.available_splits = list(available_splits)
        # The change to make, shown in a finding's fix column; a rebuilt error keeps it in its text.
        self.fix = fix
