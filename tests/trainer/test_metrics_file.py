"""metrics.jsonl lines: a step's flat record through the fast encoder, anything else as before, and
non-finite numbers always spelled as the contract says (never a silent null)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from flightdeck.worker.train.metrics_file import MetricsFile, encode_line, read_metrics


def test_a_step_and_an_event_read_back_as_written(tmp_path: Path) -> None:
    metrics = MetricsFile(tmp_path / "metrics.jsonl")
    values = {"loss": 2.5, "learning_rate": 1e-5, "grad_norm": 0.125, "tokens_per_second": None, "stage": 0}
    metrics.step(3, dict(values))
    metrics.event({"code": "G002", "severity": "fatal", "message": "dead — ünïcode", "data": {"n": [1, 2]}})
    # Written as it comes: the agent (and the stall watch) see a line as soon as it exists.
    step, event = read_metrics(tmp_path / "metrics.jsonl")
    metrics.close()
    assert step["type"] == "step" and step["step"] == 3 and isinstance(step["time"], float)
    assert {k: step[k] for k in values} == values
    assert event["message"] == "dead — ünïcode" and event["data"] == {"n": [1, 2]}


def test_non_finite_numbers_are_spelled_not_written_as_null() -> None:
    line = encode_line({"type": "step", "step": 1, "loss": float("nan"), "grad_norm": float("inf")})
    record = json.loads(line)
    assert (record["loss"], record["grad_norm"]) == ("NaN", "Infinity")
    nested = json.loads(encode_line({"type": "event", "data": {"loss": float("-inf")}}))
    assert nested["data"]["loss"] == "-Infinity"


def test_values_the_fast_encoder_does_not_take_go_through_json() -> None:
    assert json.loads(encode_line({"step": 2, "loss": np.float64(0.5), "flag": True})) == {
        "step": 2,
        "loss": 0.5,
        "flag": True,
    }
    assert json.loads(encode_line({"step": 2, "count": 2**70})) == {
        "step": 2,
        "count": 2**70,
    }  # flat, > 64 bits
    assert encode_line({"step": 1}).endswith(b"\n") and encode_line({"a": [1]}).endswith(b"\n")


# A training process that writes a step record and is then killed (SIGKILL: no flush, no atexit).
_KILLED_AFTER_A_STEP = """
import os, signal, sys
from pathlib import Path
from flightdeck.worker.train.metrics_file import MetricsFile
metrics = MetricsFile(Path(sys.argv[1]))
metrics.step(1, {"loss": 2.5})
metrics.step(2, {"loss": 2.25})
os.kill(os.getpid(), signal.SIGKILL)
"""

# A file size limit shorter than the line: the system call takes only part of it.
_SHORT_WRITE = """
import errno, resource, signal, sys
from pathlib import Path
from flightdeck.worker.train.metrics_file import MetricsFile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the limit answers EFBIG instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (40, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
metrics = MetricsFile(Path(sys.argv[1]))
try:
    metrics.step(1, {"loss": 2.5, "message": "x" * 100})
except OSError as error:
    print("raised", errno.errorcode[error.errno])
else:
    print("returned")
"""


def test_a_step_survives_the_training_process_being_killed_right_after_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_A_STEP, str(path)], capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 2.5), (2, 2.25)]


def test_a_line_the_system_takes_only_part_of_is_written_on_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    proc = subprocess.run([sys.executable, "-c", _SHORT_WRITE, str(path)], capture_output=True, text=True)
    # The first write() took 40 bytes; writing the rest hits the limit, and that is an error, not a cut line.
    assert proc.stdout.strip() == "raised EFBIG", proc.stdout + proc.stderr
    assert path.stat().st_size == 40
