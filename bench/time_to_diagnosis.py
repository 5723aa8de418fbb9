"""Time to diagnosis: seconds from the first moment a failure's signal exists to the job's end.

A real service and agent on this host run unmodified script jobs with a planted failure each (no
Flightdeck import in the scripts): pytorch/examples' style DDP loop of the tests (a loss that is always
0 -> D005, a learning rate that overflows -> H001, an uploader thread that blocks exit -> H008), plain
loops shaped like users' (house prices regressed in dollars: a gradient norm far above the limit ->
H002; a full-batch fit whose learning rate is in the wrong units: a frozen loss while gradients flow ->
H004, a warning; a sigmoid classifier whose learning rate saturates it: every gradient exactly 0 ->
H007; a peft LoRA encoder run under torch.no_grad() "because the base is frozen": adapters with no
gradient -> G002) and two short scripts whose data code fails the way users' does (an in-memory dataset
emptied by pickling -> D004 and a collate that calls .cuda() in a loader worker on a CPU host -> E001,
both read from the log). The signal's moment: the wall time of the first step record that shows it
(metrics.jsonl, written by rank 0 as the step ends), the moment the script ended on every rank (H008),
or the time the script wrote just before it raised (the log codes). The end: the job's `finished_at`;
for H004, which warns and lets the job succeed, the time of its warning on the job's events (the time
the rank emitted it). Median of `--runs` runs.

Usage: python -m bench.time_to_diagnosis [--runs 3] [--cases H002,G002]
"""

from __future__ import annotations

import functools
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
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from bench.harness import (
    RESULTS_DIR,
    ResultsDir,
    interleaved,
    run_cli,
    start_flightdeck,
    stop_process,
    write_results,
)

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


UNNORMALISED_TARGETS = '''"""House prices from listing features: a linear regression on the prices as listed, in dollars."""
import argparse
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--learning_rate", type=float, default=1e-10)
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

torch.manual_seed(0)
rooms_area_age = torch.rand(512, 3)
price = 50_000 + rooms_area_age @ torch.tensor([[40_000.0], [250_000.0], [-20_000.0]])
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
for step in range(args.steps):
    batch = torch.randint(0, 512, (32,))
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(rooms_area_age[batch]), price[batch])
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.1f}", flush=True)
'''

DETACHED_ADAPTER = '''"""LoRA on a small sensor encoder, with a new regression head."""
import argparse
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--learning_rate", type=float, default=1e-3)
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


torch.manual_seed(0)
encoder = get_peft_model(Encoder(), LoraConfig(r=4, lora_alpha=8, target_modules=["fc1", "fc2"]))
head = nn.Linear(32, 1)
trainable = [p for p in encoder.parameters() if p.requires_grad] + list(head.parameters())
optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate)
signals, targets = torch.rand(256, 20), torch.rand(256, 1)
for step in range(args.steps):
    batch = torch.randint(0, 256, (16,))
    with torch.no_grad():  # the base encoder is frozen: no activations to keep for it
        features = encoder(signals[batch])
    loss = nn.functional.mse_loss(head(features), targets[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
'''

LEARNING_RATE_IN_WRONG_UNITS = '''"""Calibration fit of a small MLP on the whole (small) table each step, with a learning rate from the config."""
import argparse
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--learning_rate", type=float, default=1e-2)
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()

torch.manual_seed(0)
readings, reference = torch.rand(128, 8), torch.rand(128, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
for step in range(args.steps):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(readings), reference)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
'''

SATURATED_CLASSIFIER = '''"""A churn classifier: logistic output on customer features, full fine-tune."""
import argparse
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--learning_rate", type=float, default=1e-2)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
features = torch.rand(256, 20)
churned = (torch.rand(256, 1) < 0.8).float()
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
loss_fn = nn.BCELoss()
for epoch in range(args.epochs):
    for x, y in DataLoader(TensorDataset(features, churned), batch_size=16, shuffle=True):
        optimizer.zero_grad()
        loss = loss_fn(torch.sigmoid(model(x)), y)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
'''


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


def _warned(code: str) -> Callable[[list[dict[str, Any]]], float | None]:
    """The moment the job's warning with this code was recorded: a warning does not end the job."""

    def moment(events: list[dict[str, Any]]) -> float | None:
        times = [float(e["time"]) for e in events if e.get("code") == code and e.get("severity") == "warn"]
        return min(times) if times else None

    return moment


def _flat_from_step_2(record: dict[str, Any], previous: dict[str, float | None]) -> bool:
    """A loss equal to the step before's while the gradient flows (H004's signal, from its second step)."""
    loss, last = record.get("loss"), previous.get("loss")
    previous["loss"] = loss
    return last is not None and loss == last and bool(record.get("grad_norm"))


@dataclass(frozen=True)
class Case:
    """One planted failure: the script job, how it must end, and where its signal's moment is read."""

    script: str
    args: list[str]
    processes: int
    health: dict[str, Any]
    expected: tuple[str, str | None]  # (status, failure_code)
    signal: Callable[[Path], float | None]
    # For a warning (the job does not fail): the moment it was diagnosed, from the job's events.
    diagnosed: Callable[[list[dict[str, Any]]], float | None] | None = None


CASES: dict[str, Case] = {
    "D005": Case(
        "ddp_loop.py", ["--zero_loss", "--total_epochs", "2"], 1, {}, ("failed", "D005"),
        lambda d: _first_step(d, lambda r: r.get("loss") == 0),
    ),
    "H001": Case(
        "ddp_loop.py", ["--lr", "1e38", "--total_epochs", "2"], 1, {}, ("failed", "H001"),
        lambda d: _first_step(d, lambda r: not _finite(r.get("loss")) or not _finite(r.get("grad_norm"))),
    ),
    "H002": Case(
        "house_prices.py", [], 1, {}, ("failed", "H002"),
        lambda d: _first_step(d, lambda r: _finite(r.get("grad_norm")) and r["grad_norm"] > 1000.0),
    ),
    "H004": Case(
        "calibration.py", ["--learning_rate", "1e-9"], 1, {"flat_loss_patience": 5}, ("succeeded", None),
        lambda d: _first_step(d, functools.partial(_flat_from_step_2, previous={})),
        diagnosed=_warned("H004"),
    ),
    "H007": Case(
        "churn.py", ["--learning_rate", "1e4"], 1, {}, ("failed", "H007"),
        lambda d: _first_step(d, lambda r: r.get("grad_norm") == 0 and _finite(r.get("loss")) and r["loss"] != 0),
    ),
    "G002": Case(
        "sensor_lora.py", [], 1, {}, ("failed", "G002"),
        # lora_B starts at 0, so lora_A's gradient may be 0 at step 1: the signal exists from step 2.
        lambda d: _first_step(d, lambda r: r["step"] >= 2 and not r.get("adapter_grad_norm")),
    ),
    "H008": Case(
        "ddp_loop.py", ["--hang_at_exit", "--total_epochs", "1"], 2, {"teardown_grace_seconds": 5},
        ("succeeded", None), _script_end,
    ),
    "D004": Case("emptied.py", [], 1, {}, ("failed", "D004"), _written_signal),
    "E001": Case("cuda_collate.py", [], 1, {}, ("failed", "E001"), _written_signal),
}  # fmt: skip


def run(
    runs: Annotated[int, typer.Option("--runs", help="runs of each case")] = 3,
    cases: Annotated[str, typer.Option(help="comma-separated codes; all by default")] = ",".join(CASES),
    results_dir: ResultsDir = RESULTS_DIR,
) -> None:
    options = SimpleNamespace(runs=runs, results_dir=results_dir)
    unknown = sorted(set(cases.split(",")) - set(CASES))
    if unknown:
        raise typer.BadParameter(
            f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}", param_hint="--cases"
        )
    chosen = {code: CASES[code] for code in cases.split(",")}
    measured: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "workspace"
        (workspace / "user").mkdir(parents=True)
        shutil.copy(DDP_LOOP, workspace / "user" / "ddp_loop.py")
        (workspace / "user" / "emptied.py").write_text(EMPTIED_BY_PICKLING)
        (workspace / "user" / "cuda_collate.py").write_text(CUDA_IN_COLLATE)
        (workspace / "user" / "house_prices.py").write_text(UNNORMALISED_TARGETS)
        (workspace / "user" / "calibration.py").write_text(LEARNING_RATE_IN_WRONG_UNITS)
        (workspace / "user" / "churn.py").write_text(SATURATED_CLASSIFIER)
        (workspace / "user" / "sensor_lora.py").write_text(DETACHED_ADAPTER)
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

            def diagnose(code: str) -> float:
                """One job of the case: seconds from its signal's first step to its diagnosis."""
                case = chosen[code]
                recipe = {
                    "name": f"ttd-{code}",
                    "entrypoint": {"script": f"user/{case.script}", "args": case.args},
                    "resources": {"gpus_per_node": case.processes, "accelerator": "cpu"},
                    "health": case.health,
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
                if got != case.expected:
                    raise RuntimeError(
                        f"{code}: expected {case.expected}, got {got}: {job.get('failure_message')}"
                    )
                run_dir = Path(job["attempts"][-1]["plan"]["run_dir"])
                began = case.signal(run_dir)
                if began is None:
                    raise RuntimeError(f"{code}: the signal's moment was not found in {run_dir}")
                ended: float | None = float(job["finished_at"])
                if case.diagnosed is not None:
                    events = api.get(f"/jobs/{job_id}/events").json()["events"]
                    ended = case.diagnosed(events)
                    if ended is None:
                        raise RuntimeError(f"{code}: the job {job_id} ended {got} without the warning {code}")
                assert ended is not None
                print(f"{code}: {ended - began:.2f} s", flush=True)
                return ended - began

            measured = interleaved(options.runs, list(chosen), diagnose)
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
