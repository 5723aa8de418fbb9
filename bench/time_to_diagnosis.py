"""Time to diagnosis: seconds from the first moment a failure's signal exists to the job's end.

A real service and agent on this host run unmodified script jobs with a planted failure each (no
Flightdeck import in the scripts): pytorch/examples' style DDP loop of the tests (a loss that is always
0 -> D005, a learning rate that overflows -> H001, an uploader thread that blocks exit -> H008) and
two short scripts whose data code fails the way users' does (an in-memory dataset emptied by pickling
-> D004 and a collate that calls .cuda() in a loader worker on a CPU host -> E001, both read from the
log). The signal's moment: the wall time of the first step record that shows it (metrics.jsonl, written
by rank 0 as the step ends), the moment the script ended on every rank (H008), or the time the script
wrote just before it raised (the log codes). The end: the job's `finished_at`. Median of `--runs` runs.

Usage: python -m bench.time_to_diagnosis [--runs 3]
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from bench.harness import RESULTS_DIR, ResultsDir, run_cli, start_flightdeck, stop_process, write_results

ROOT = Path(__file__).resolve().parents[1]
DDP_LOOP = ROOT / "tests" / "agent" / "user_scripts" / "ddp_loop.py"

EMPTIED_BY_PICKLING = '''
import os, pickle, time
import torch
from torch.utils.data import DataLoader, Dataset


class Corpus(Dataset):
    """Rows kept in memory, left out of the pickle 'to keep it small' (R3)."""

    def __init__(self):
        self.rows = [torch.rand(4) for _ in range(64)]

    def __getstate__(self):
        return {"rows": []}

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if not self.rows:
            open(os.path.join(os.environ["FLIGHTDECK_RUN_DIR"], "signal.txt"), "w").write(str(time.time()))
            raise ValueError("The batch received was empty, your model won't be able to train on it.")
        return self.rows[i]


if __name__ == "__main__":
    for batch in DataLoader(Corpus(), batch_size=8, num_workers=1, multiprocessing_context="spawn"):
        pass
'''

CUDA_IN_COLLATE = """
import os, time
import torch
from torch.utils.data import DataLoader


def collate(rows):
    open(os.path.join(os.environ["FLIGHTDECK_RUN_DIR"], "signal.txt"), "w").write(str(time.time()))
    return torch.stack(rows).cuda()


for batch in DataLoader([torch.rand(4) for _ in range(64)], batch_size=8, num_workers=1, collate_fn=collate):
    pass
"""


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _first_step(run_dir: Path, shows: Callable[[dict[str, Any]], bool]) -> float | None:
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "step" and shows(record):
            return float(record["time"])
    return None


def _script_end(run_dir: Path) -> float | None:
    ends = [p.stat().st_mtime for p in run_dir.glob("script-end-rank*.json")]
    return max(ends) if ends else None


def _written_signal(run_dir: Path) -> float | None:
    path = run_dir / "signal.txt"
    return float(path.read_text()) if path.is_file() else None


# code -> (script, args, processes, health, expected (status, failure_code), the signal's moment)
CASES: dict[str, tuple[str, list[str], int, dict[str, Any], tuple[str, str | None], Callable[[Path], float | None]]] = {
    "D005": (
        "ddp_loop.py", ["--zero_loss", "--total_epochs", "2"], 1, {}, ("failed", "D005"),
        lambda d: _first_step(d, lambda r: r.get("loss") == 0),
    ),
    "H001": (
        "ddp_loop.py", ["--lr", "1e38", "--total_epochs", "2"], 1, {}, ("failed", "H001"),
        lambda d: _first_step(d, lambda r: not _finite(r.get("loss")) or not _finite(r.get("grad_norm"))),
    ),
    "H008": (
        "ddp_loop.py", ["--hang_at_exit", "--total_epochs", "1"], 2, {"teardown_grace_seconds": 5},
        ("succeeded", None), _script_end,
    ),
    "D004": ("emptied.py", [], 1, {}, ("failed", "D004"), _written_signal),
    "E001": ("cuda_collate.py", [], 1, {}, ("failed", "E001"), _written_signal),
}  # fmt: skip


def run(
    runs: Annotated[int, typer.Option("--runs", help="runs of each case")] = 3,
    cases: Annotated[str, typer.Option(help="comma-separated codes; all by default")] = ",".join(CASES),
    results_dir: ResultsDir = RESULTS_DIR,
) -> None:
    options = SimpleNamespace(runs=runs, results_dir=results_dir)
    chosen = {code: CASES[code] for code in cases.split(",")}
    measured: dict[str, list[float]] = {code: [] for code in chosen}
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "workspace"
        (workspace / "user").mkdir(parents=True)
        shutil.copy(DDP_LOOP, workspace / "user" / "ddp_loop.py")
        (workspace / "user" / "emptied.py").write_text(EMPTIED_BY_PICKLING)
        (workspace / "user" / "cuda_collate.py").write_text(CUDA_IN_COLLATE)
        server = start_flightdeck(Path(tmp) / "service")
        agent_env = {
            **os.environ,
            "FLIGHTDECK_SERVICE_URL": server.url,
            "FLIGHTDECK_WORKER_TOKEN": server.worker_token,
            "FLIGHTDECK_CPU_SLOTS": "2",
            "FLIGHTDECK_WORKER_NAME": "bench",
        }
        argv = [
            sys.executable,
            "-c",
            "from flightdeck.cli.main import main; main()",
            "worker",
            "--workspace",
            str(workspace),
        ]
        argv += ["--runs-dir", str(Path(tmp) / "runs"), "--poll-wait", "1"]
        with open(Path(tmp) / "agent.log", "wb") as log:
            agent = subprocess.Popen(argv, env=agent_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            api = server.client(server.user_token)
            for _ in range(options.runs):
                for code, (script, args, processes, health, expected, signal) in chosen.items():
                    recipe = {
                        "name": f"ttd-{code}",
                        "entrypoint": {"script": f"user/{script}", "args": args},
                        "resources": {"gpus_per_node": processes, "accelerator": "cpu"},
                        "health": health,
                    }
                    answer = api.post("/jobs", json=recipe, params={"max_attempts": 1})
                    answer.raise_for_status()
                    job_id = answer.json()["id"]
                    deadline = time.monotonic() + 300
                    while True:
                        job = api.get(f"/jobs/{job_id}").json()
                        if job["status"] in ("succeeded", "failed", "cancelled"):
                            break
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{code}: job {job_id} did not end in 300 s")
                        time.sleep(0.2)
                    got = (job["status"], job.get("failure_code"))
                    if got != expected:
                        raise RuntimeError(
                            f"{code}: expected {expected}, got {got}: {job.get('failure_message')}"
                        )
                    run_dir = Path(job["attempts"][-1]["plan"]["run_dir"])
                    began = signal(run_dir)
                    if began is None:
                        raise RuntimeError(f"{code}: the signal's moment was not found in {run_dir}")
                    measured[code].append(float(job["finished_at"]) - began)
                    print(f"{code}: {measured[code][-1]:.2f} s", flush=True)
        finally:
            stop_process(agent.pid)
            server.stop()
    results: dict[str, Any] = {"runs": options.runs, "seconds": measured}
    for code, seconds in measured.items():
        results[f"{code}_median_s"] = statistics.median(seconds)
        print(
            f"{code}: median {statistics.median(seconds):.2f} s over {len(seconds)} runs ({', '.join(f'{s:.2f}' for s in seconds)})"
        )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    write_results("time_to_diagnosis", results, options.results_dir)


def main(argv: list[str] | None = None) -> None:
    run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
