"""Ending a process whose work is done without the interpreter's teardown.

Native thread pools left by the libraries a worker process loads (Arrow's parquet readers, a process
group's gloo threads) can abort the process while the interpreter tears down: "terminate called without
an active exception", SIGABRT, after everything was written. The process's parent then reads a failure
(torchrun fails a run that succeeded; `srun --kill-on-bad-exit` stops the other nodes; a test reads
-6). Processes that have written every result end here instead.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_without_teardown(code: int) -> NoReturn:
    """Flush what the process printed, then end it with `code` at once (logging's handlers flush each
    record as it is written)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
