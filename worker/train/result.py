"""result.json: how the run ended, written once by rank 0 (docs/contracts.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from flightdeck.contracts import HEALTH_EXIT_CODE, RESULT_FILE

__all__ = ["HEALTH_EXIT_CODE", "write_result"]


def write_result(
    run_dir: Path,
    *,
    status: Literal["succeeded", "failed"],
    message: str,
    failure_code: str | None = None,
    fix: str | None = None,
    output_path: str | None = None,
    findings: list[dict[str, Any]] | None = None,
) -> Path:
    """Write result.json atomically so the agent never reads half a file."""
    path = run_dir / RESULT_FILE
    payload = {
        "status": status,
        "failure_code": failure_code,
        "message": message,
        "fix": fix,
        "output_path": output_path,
    }
    if findings:
        payload["findings"] = findings
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per writer: two never rename each other's
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
