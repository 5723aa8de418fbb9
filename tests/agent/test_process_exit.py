"""A process whose work is done ends with its code and everything it printed, whatever its threads do."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# A thread that never ends is what interpreter teardown trips on (it joins non-daemon threads; a
# native pool's thread aborts): the process must end anyway, with what it printed to a pipe.
SCRIPT = textwrap.dedent(
    """
    import threading
    from flightdeck.worker.process_exit import exit_without_teardown

    threading.Thread(target=threading.Event().wait).start()
    print("result written")
    exit_without_teardown(3)
    """
)


def test_a_finished_process_ends_at_once_with_its_code_and_its_printed_output() -> None:
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a pipe is by default
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30, env=buffered
    )
    assert (done.returncode, done.stdout) == (3, "result written\n")
