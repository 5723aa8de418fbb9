"""The checks only a worker's host preflight runs: they read the model's and the data's own files.

`flightdeck preflight` names them whenever it cannot run them itself (no local workspace), so a dry
run never reports "passed" over checks that did not run. worker/host_preflight/run.py runs them; a
test keeps this list and the codes raised there the same.
"""

from __future__ import annotations

WORKER_CHECKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the model path loads (a local directory, or a hub id the worker reaches)", ("P008",)),
    ("LoRA target modules exist among the model's linear modules", ("G006",)),
    ("named parts, the task and the dtype fit the model's architecture", ("X002", "V002", "V005")),
    ("the tokenizer: pad token, tokens beyond the embeddings", ("G009", "G011", "G013")),
    ("loss normalisation under gradient accumulation (the model's forward)", ("G015",)),
    (
        "dataset files, splits, field names and the first rows; images",
        ("D001", "D002", "D003", "D004", "D005", "D007", "D008", "D009", "D010", "V001", "V003"),
    ),
    ("evaluation memory with the real data", ("M003",)),
    ("CUDA asked of a CPU worker", ("E007",)),
    ("a script's requirements file leaves the worker's torch in place", ("E009",)),
    ("the rendezvous port is free; no launcher variables inherited", ("E002", "P005")),
)


def worker_check_lines() -> list[str]:
    """One line per check: what it looks at and the codes it raises."""
    return [f"{what} ({', '.join(codes)})" for what, codes in WORKER_CHECKS]
