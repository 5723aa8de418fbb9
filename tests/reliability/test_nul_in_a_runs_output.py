"""A run whose output holds a NUL byte ends as it ran, on SQLite and PostgreSQL alike: the script
below printed `training done \\x00` and exited 0, and its job once succeeded on SQLite and failed on
PostgreSQL (`lease_lost`: the finish report's log tail was refused). Real service, agent, torchrun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_end_to_end import _submit, _wait_status

pytestmark = pytest.mark.slow

SCRIPT = """\
import sys

print("step 1 loss 2.0", flush=True)
sys.stdout.write("training done \\x00 with a NUL\\n")
sys.stdout.flush()
"""


def test_a_log_with_nul_succeeds_on_both_databases(
    cluster: Any, tiny_workspace: Path, database_url: str
) -> None:
    (tiny_workspace / "scripts").mkdir(exist_ok=True)
    (tiny_workspace / "scripts" / "prints_nul.py").write_text(SCRIPT)
    service = cluster("service", database_url=database_url)
    cluster("agent", service, "nul-printer", slots=1)
    api = service.api()
    job = {
        "name": "prints-nul",
        "entrypoint": {"script": "scripts/prints_nul.py"},
        "resources": {"accelerator": "cpu", "gpus_per_node": 1},
    }
    job_id = _submit(api, job)
    done = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 120)
    assert done["status"] == "succeeded", done
    log = api.get(f"/jobs/{job_id}/logs").json()["text"]
    assert "training done" in log
