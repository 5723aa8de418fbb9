"""Known harmless warnings that would start every rank's log, silenced by exact text.

Each is understood and says nothing about the run; a log that opens with them trains readers to
skip warnings. Only these exact messages are dropped, nothing else from the same libraries.
"""

from __future__ import annotations

import logging
import warnings

# bitsandbytes' CPU backend tries an optional kernel hub package at import on AVX512-BF16 CPUs; the
# built-in kernel it falls back to is the one used anyway.
_BNB_LOGGER = "bitsandbytes.backends.cpu.ops"
_BNB_TEXT = "from kernels-community"
# transformers 5.x deprecates is_gradient_checkpointing; peft still reads it (every rank, once).
_CHECKPOINTING_DEPRECATION = r"`is_gradient_checkpointing` is deprecated"


class _DropText(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def silence_known_noise() -> None:
    """Call before transformers/peft/bitsandbytes are imported (filters apply to later records)."""
    logger = logging.getLogger(_BNB_LOGGER)
    if not any(isinstance(f, _DropText) for f in logger.filters):
        logger.addFilter(_DropText(_BNB_TEXT))
    warnings.filterwarnings("ignore", message=_CHECKPOINTING_DEPRECATION, category=FutureWarning)
