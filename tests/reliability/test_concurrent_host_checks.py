"""Several attempts claimed at once by a fresh agent run their host checks concurrently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a fresh interpreter loads torch and transformers: about 20 s


def test_concurrent_host_checks_in_a_fresh_agent_all_read_the_model(tiny_workspace: Path) -> None:
    probe = [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "tests.reliability.host_check_race",
        str(tiny_workspace),
        "4",
    ]
    done = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"the probe ended with {done.returncode}:\n{done.stderr[-4000:]}"
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert errors == []
