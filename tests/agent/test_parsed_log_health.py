"""The last resort's metrics (an HF Trainer's own log lines, parsed after the run) get the pinned form of
H004 as the callback judges it live: a norm clipped at every step while the loss does not fall."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flightdeck.worker.agent.log_metrics import fill_metrics_from_log
from flightdeck.worker.train.metrics_file import read_metrics


def _trainer_log(losses: list[float], norms: list[float]) -> str:
    """What transformers 5's Trainer prints per logged step (numbers as strings), among other output."""
    lines = ["***** Running training *****", "  Num examples = 64"]
    for step, (loss, norm) in enumerate(zip(losses, norms, strict=True), 1):
        lines.append(
            f"{{'loss': '{loss:.4g}', 'grad_norm': '{norm:.4g}', 'learning_rate': '0.5', 'epoch': '{step / 10:.2f}'}}"
        )
    lines.append(
        "{'train_runtime': '1.2', 'train_samples_per_second': '100.0', 'train_loss': '6.2', 'epoch': '1.2'}"
    )
    return "\n".join(lines) + "\n"


def _run_dir(tmp_path: Path, log: str, args: list[str], **recipe: Any) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script_job = {"name": "sft", "entrypoint": {"script": "train.py", "args": args}, **recipe}
    (run_dir / "recipe.json").write_text(json.dumps(script_job))
    (run_dir / "output.log").write_text(log)
    return run_dir


# A learning rate that overshoots: the loss jumps about its start while every step is clipped.
JUMPING = [6.2, 6.9, 5.8, 7.4, 6.1, 8.2, 6.6, 7.9, 6.4, 8.8, 7.1, 9.3]
CLIPPED = [3.65, 4.1, 5.2, 3.9, 6.3, 4.4, 7.1, 5.0, 6.6, 8.2, 5.9, 9.4]
HEALTH = {"flat_loss_patience": 8}


def test_a_norm_clipped_at_every_step_with_a_loss_that_does_not_fall_warns_h004(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, _trainer_log(JUMPING, CLIPPED), ["--learning_rate", "0.5"], health=HEALTH)
    assert fill_metrics_from_log(run_dir) == 12
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["type"] == "step"] == list(range(1, 13))
    (event,) = [r for r in records if r["type"] == "event"]
    assert (event["code"], event["severity"], event["step"]) == ("H004", "warn", 8)  # the window's 8 steps
    assert event["data"]["max_grad_norm"] == 1.0 and event["data"]["source"] == "parsed_from_log"
    assert "clipped" in event["message"] and "--learning_rate" in event["fix"]


def test_the_scripts_own_max_grad_norm_argument_is_the_limit(tmp_path: Path) -> None:
    args = ["--learning_rate", "0.5", "--max_grad_norm", "10"]  # none of these norms reaches it
    run_dir = _run_dir(tmp_path, _trainer_log(JUMPING, CLIPPED), args, health=HEALTH)
    assert fill_metrics_from_log(run_dir) == 12
    assert not [r for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "event"]


def test_a_clipped_run_whose_loss_falls_is_healthy(tmp_path: Path) -> None:
    falling = [6.2 * 0.95**i for i in range(12)]
    run_dir = _run_dir(tmp_path, _trainer_log(falling, CLIPPED), [], health=HEALTH)
    assert fill_metrics_from_log(run_dir) == 12
    assert not [r for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "event"]
