"""Fixtures for the trainer tests: one tiny workspace per session, and a torchrun launcher."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flightdeck.recipe.validate import deep_merge
from flightdeck.worker.tiny import make_demo_workspace
from flightdeck.worker.train.metrics_file import read_metrics

REPO = Path(__file__).resolve().parents[2]
# The inherited launcher variables would make the child think it is already a rank (P005).
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")

BASE_RECIPE: dict[str, Any] = {
    "name": "tiny-test",
    "task": "causal_lm",
    "model": {"path": "models/tiny-llama", "dtype": "float32", "gradient_checkpointing": True},
    "adapter": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    "data": {
        "train": [
            {"path": "data/chartqa", "preset": "chartqa", "split": "train"},
            {"path": "data/infovqa.parquet", "preset": "infovqa"},
            {"path": "data/ocrvqa.jsonl", "preset": "ocrvqa"},
        ],
        "max_seq_length": 64,
        "num_workers": 0,
    },
    "training": {
        "per_device_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "learning_rate": 0.01,
        "max_steps": 6,
        "precision": "fp32",
        "warmup_ratio": 0.0,
        "logging_steps": 1,
    },
    "resources": {"nodes": 1, "gpus_per_node": 2, "accelerator": "any"},
    "env": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
}


@dataclass
class RunOutcome:
    """What one torchrun of flightdeck.worker.train left behind."""

    returncode: int
    output: str
    run_dir: Path
    records: list[dict[str, Any]]
    result: dict[str, Any] | None

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == "step"]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == "event"]

    def describe(self) -> str:
        return f"rc={self.returncode} result={self.result}\n{self.output[-4000:]}"


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every tiny model (text and vision-language) and data/ built once per session."""
    return make_demo_workspace(tmp_path_factory.mktemp("workspace"))


@pytest.fixture
def make_recipe() -> Callable[..., dict[str, Any]]:
    """BASE_RECIPE (a tiny LoRA run on the mixed demo data) with nested overrides deep-merged."""

    def make(**overrides: Any) -> dict[str, Any]:
        return deep_merge(copy.deepcopy(BASE_RECIPE), overrides)

    return make


@pytest.fixture
def run_trainer(workspace: Path, tmp_path: Path) -> Callable[..., RunOutcome]:
    """Run `torchrun --nproc_per_node N -m flightdeck.worker.train run/recipe.json` as the agent would."""

    def run(recipe: dict[str, Any], nproc: int = 2, timeout: float = 240) -> RunOutcome:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "recipe.json").write_text(json.dumps(recipe))
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        env |= {
            "FLIGHTDECK_WORKSPACE": str(workspace),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        proc = subprocess.run(
            [*argv, "-m", "flightdeck.worker.train", str(run_dir / "recipe.json")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        result_path = run_dir / "result.json"
        return RunOutcome(
            returncode=proc.returncode,
            output=proc.stdout + proc.stderr,
            run_dir=run_dir,
            records=read_metrics(run_dir / "metrics.jsonl"),
            result=json.loads(result_path.read_text()) if result_path.exists() else None,
        )

    return run
