"""Findings never serve as a way to read a file: a recipe that names a secret as its dataset gets a
finding that quotes at most a short prefix of any value or column name, and a file that is not text
is a data finding naming the file and the byte offset, never an agent failure carrying its bytes.
Through a real service and agent; the secret sits in the workspace, where a careless layout puts it."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from .processes import Agent, Service, free_tcp_port, kill_strays
from .test_end_to_end import _submit, _wait_status

SECRET = "fdw_S3cr3tT0k3nTh4tMustN3v3rL34kInAFinding0"
# Findings quote at most this much of any value or column name (docs/failures.md).
QUOTE = 16


def _recipe(name: str, source: dict[str, Any], **data: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"path": "models/tiny-llama", "dtype": "float32", "gradient_checkpointing": False},
        "data": {"train": [source], "num_workers": 0, **data},
        "training": {"max_steps": 2, "precision": "fp32", "per_device_batch_size": 1},
        "resources": {"accelerator": "cpu", "gpus_per_node": 1},
    }


def _leaks(text: str) -> bool:
    """Whether `text` holds more than a QUOTE-long piece of the secret."""
    return any(SECRET[i : i + QUOTE + 1] in text for i in range(len(SECRET) - QUOTE))


@pytest.mark.slow  # a real service and agent, three jobs
def test_findings_quote_no_more_than_a_prefix_of_a_secret(tiny_workspace: Path, tmp_path: Path) -> None:
    secrets_dir = tiny_workspace / "leaky"
    secrets_dir.mkdir(exist_ok=True)
    (secrets_dir / "tokens.env").write_text(
        f"FLIGHTDECK_USER_TOKENS={SECRET}\nFLIGHTDECK_WORKER_TOKENS={SECRET}\n"
    )
    (secrets_dir / "answers.jsonl").write_text(f'{{"question": "q", "answer": "{SECRET * 20}"}}\n')
    database = secrets_dir / "state.db"
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE t (token TEXT)")
        conn.execute("INSERT INTO t VALUES (?)", (SECRET,))
    service = Service(tmp_path / "data", free_tcp_port())
    agent = Agent(service, tiny_workspace, tmp_path / "runs", "quoting", slots=1)
    try:
        service.start()
        agent.start()
        api = service.api()
        jobs = {
            # D001 once listed "fields that exist: FLIGHTDECK_USER_TOKENS=<the whole token>".
            "columns": _submit(
                api, _recipe("columns", {"path": "leaky/tokens.env", "format": "csv", "preset": "alpaca"})
            ),
            # D005 once printed 35 of the 43 characters of an answer.
            "answer": _submit(
                api,
                _recipe(
                    "answer", {"path": "leaky/answers.jsonl"}, max_seq_length=8, prompt_template="{question}"
                ),
            ),
            # A database read as text once failed as an agent error carrying 2,000 raw bytes.
            "binary": _submit(api, _recipe("binary", {"path": "leaky/state.db", "format": "jsonl"})),
        }
        for what, job_id in jobs.items():
            job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 120)
            assert job["status"] == "failed", (what, job)
            assert job["failure_class"] == "preflight" and (job["failure_code"] or "").startswith("D"), (
                what,
                job,
            )
            shown = " ".join(
                [
                    str(job),
                    api.get(f"/jobs/{job_id}/events", params={"limit": 1000}).text,
                    api.get(f"/jobs/{job_id}/logs").text,
                ]
            )
            assert not _leaks(shown), (what, shown[:2000])
        binary = _wait_status(api, jobs["binary"], {"failed"}, 5)
        assert "state.db" in binary["failure_message"] and "byte" in binary["failure_message"], binary
    finally:
        agent.stop(timeout=20)
        service.stop()
        kill_strays(str(tmp_path))
