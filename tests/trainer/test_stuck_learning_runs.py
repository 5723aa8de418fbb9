"""The stuck-learning warnings on real runs: R2's stage 1 miniature under torchrun (H007, a gradient that
vanished without reaching 0), and a user's plain loop whose clip_grad_norm_ binds at every step (H004),
watched with no edit."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flightdeck.worker.train.metrics_file import read_metrics
from tests.agent.test_instrument import USER_SCRIPTS, _plan, _rank_env

from .conftest import REPO, RunOutcome

pytestmark = pytest.mark.slow


def test_r2_stage_1_warns_h007_when_its_gradient_vanishes_and_still_succeeds(
    run_trainer: Callable[..., RunOutcome],
) -> None:
    example = json.loads((REPO / "examples" / "r2-two-stage.json").read_text())
    stage_1 = {**example, "stages": None, "adapter": None}
    stage_1["model"] = {**example["model"], "freeze": ["language_model"]}
    stage_1["training"] = {**example["training"], "max_steps": 14}
    outcome = run_trainer(stage_1, nproc=1)
    assert outcome.returncode == 0 and outcome.result and outcome.result["status"] == "succeeded", (
        outcome.describe()
    )
    (warning,) = [e for e in outcome.events if e["severity"] == "warn"]
    assert warning["code"] == "H007" and 8 <= warning["step"] <= 14, warning
    data = warning["data"]
    assert data["peak_step"] == 1 and data["grad_norm"] * 100 <= data["peak_grad_norm"], data
    assert data["loss"] > 0.9 * data["first_loss"] and "model.freeze" in warning["fix"]
    norms = {s["step"]: s["grad_norm"] for s in outcome.steps}
    assert 0 < norms[warning["step"]] < 0.02  # near zero, not zero: the fatal H007 does not apply


def test_a_plain_loop_clipped_at_every_step_with_a_loss_that_does_not_fall_warns_h004(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # The job's health as the agent writes it into the run directory (the watch reads it there).
    (run_dir / "recipe.json").write_text(json.dumps({"health": {"flat_loss_patience": 8}}))
    args = ["--total_epochs", "2", "--lr", "5", "--clip_grad_norm", "0.5"]
    plan = _plan({"script": "ddp_loop.py", "args": args}, workspace=str(USER_SCRIPTS))
    proc = subprocess.run(
        [sys.executable, str(USER_SCRIPTS / "ddp_loop.py"), *args],
        env=_rank_env(plan, run_dir),
        cwd=run_dir,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a warning never stops a run
    records: list[dict[str, Any]] = read_metrics(run_dir / "metrics.jsonl")
    (warning,) = [r for r in records if r["type"] == "event" and r["severity"] == "warn"]
    # The limit is the script's own clip_grad_norm_ call's max_norm, the norms that call's pre-clip totals.
    assert warning["code"] == "H004" and warning["data"]["max_grad_norm"] == pytest.approx(0.5, rel=1e-5)
    assert "clip_grad_norm_" in warning["fix"] and "at or above max_grad_norm 0.5" in warning["message"]
    norms = [r["grad_norm"] for r in records if r["type"] == "step"]
    assert min(norms[-8:]) >= 0.5 and len({round(n, 5) for n in norms}) > 1, norms
