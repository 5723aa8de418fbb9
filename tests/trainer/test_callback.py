"""flightdeck.worker.callback: a user's own HF Trainer script or plain loop gets the trainer's records and health stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

from flightdeck.callback import FlightdeckCallback, HealthStop, LoopMonitor
from flightdeck.worker.train.metrics_file import read_metrics

REPO = Path(__file__).resolve().parents[2]
OWN_SCRIPT = REPO / "examples" / "own-script"
sys.path.insert(0, str(OWN_SCRIPT))

from common import PromptAnswerDataset, arithmetic_texts, pad_batch  # noqa: E402


@pytest.fixture(autouse=True)
def _outside_flightdeck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLIGHTDECK_RUN_DIR", raising=False)


def _lora_model(workspace: Path) -> tuple[Any, Any]:
    tokenizer = AutoTokenizer.from_pretrained(workspace / "models/tiny-llama")
    model = AutoModelForCausalLM.from_pretrained(workspace / "models/tiny-llama", dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return tokenizer, get_peft_model(model, config)


def _trainer(workspace: Path, tmp_path: Path, callback: FlightdeckCallback, steps: int = 4) -> Trainer:
    tokenizer, model = _lora_model(workspace)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=steps,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    dataset = PromptAnswerDataset(tokenizer, arithmetic_texts(64))
    return Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=pad_batch(0), callbacks=[callback]
    )


def test_outside_flightdeck_the_callback_writes_every_step_to_the_path_given(
    workspace: Path, tmp_path: Path
) -> None:
    metrics = tmp_path / "records" / "metrics.jsonl"
    _trainer(workspace, tmp_path, FlightdeckCallback(metrics)).train()
    records = read_metrics(metrics)
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 and r["adapter_grad_norm"] > 0 and r["samples_per_second"] > 0 for r in steps)
    started = [r for r in records if r["type"] == "event" and "training started" in r["message"]]
    assert started and started[0]["data"]["adapter_tensors"] == 8
    assert not list(tmp_path.rglob("result.json"))  # no run directory: nothing pretends to be one


def test_a_trainer_that_did_not_join_its_launchers_ranks_writes_only_on_rank_0(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torchrun's rank 1, whose Trainer never joined the process group (accelerate saw no GPU and no
    # use_cpu) and so counts itself process 0: the launcher's rank decides who writes, not process_index.
    monkeypatch.setenv("RANK", "1")
    metrics = tmp_path / "records" / "metrics.jsonl"
    trainer = _trainer(workspace, tmp_path, FlightdeckCallback(metrics))
    assert trainer.args.process_index == 0
    trainer.train()
    assert not metrics.exists()


class _FreezeLayerZeroAt(TrainerCallback):
    """The model's own code freezing layer 0 (its adapters included) before optimizer step `step`."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kw):  # type: ignore[no-untyped-def]
        if state.global_step + 1 == self.step:
            model.base_model.model.model.layers[0].requires_grad_(False)


def test_a_module_frozen_after_the_first_steps_stops_at_the_next_sampled_step(
    workspace: Path, tmp_path: Path
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    trainer = _trainer(workspace, tmp_path, FlightdeckCallback(metrics), steps=30)
    trainer.add_callback(_FreezeLayerZeroAt(14))
    with pytest.raises(HealthStop) as stop:
        trainer.train()
    # Per-tensor norms at steps 1-10, then at 20 (dead since 14: the streak opens), 21 (open): patience 2.
    assert (stop.value.event.code, stop.value.event.step) == ("G002", 21)
    assert "layers.0" in stop.value.event.message
    steps = {r["step"]: r for r in read_metrics(metrics) if r["type"] == "step"}
    assert sorted(steps) == list(range(1, 22))
    # Between samples the record's adapter norm is the Trainer's own grad_norm (only adapters train).
    assert all(steps[s]["adapter_grad_norm"] == steps[s]["grad_norm"] for s in range(11, 20))
    assert steps[5]["adapter_grad_norm"] == pytest.approx(steps[5]["grad_norm"], rel=1e-4)


def test_under_flightdeck_it_writes_the_run_directory_with_the_recipes_health(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.json").write_text(json.dumps({"name": "x", "health": {"zero_grad_patience": 5}}))
    monkeypatch.setenv("FLIGHTDECK_RUN_DIR", str(run_dir))
    callback = FlightdeckCallback()
    assert callback.health.zero_grad_patience == 5
    _trainer(workspace, tmp_path, callback, steps=3).train()
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "step"] == [1, 2, 3]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "succeeded" and result["output_path"] == str((tmp_path / "out").resolve())


def test_nothing_to_train_stops_when_the_trainer_is_built_with_g001_in_the_result(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("FLIGHTDECK_RUN_DIR", str(run_dir))
    tokenizer, model = _lora_model(workspace)
    model.requires_grad_(False)  # a freeze meant for the base, run after get_peft_model
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", max_steps=2)
    with pytest.raises(HealthStop) as stop:
        Trainer(
            model=model,
            args=args,
            train_dataset=PromptAnswerDataset(tokenizer, arithmetic_texts(8)),
            data_collator=pad_batch(0),
            callbacks=[FlightdeckCallback()],
        )
    assert stop.value.event.code == "G001"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["failure_code"] == "G001" and "re-enable requires_grad" in result["fix"]


@pytest.mark.slow
def test_r1s_lazily_frozen_tower_exits_42_with_g002_naming_the_tower_adapters(
    workspace: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env |= {"FLIGHTDECK_RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(OWN_SCRIPT / "r1_lazy_tower.py"), "--max-steps", "20"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 42, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["failure_code"] == "G002" and "vision_tower" in result["message"]
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "step"]
    assert steps == [1, 2, 3]  # lora_B is zero at step 1; two dead steps from step 2 on: stopped at 3
    assert "[flightdeck] fix:" in proc.stderr


def _loop(model: Any, tokenizer: Any, monitor: LoopMonitor, optimizer: Any, steps: int) -> None:
    loader = torch.utils.data.DataLoader(
        PromptAnswerDataset(tokenizer, arithmetic_texts(64)), batch_size=4, collate_fn=pad_batch(0)
    )
    model.train()
    for step, batch in enumerate(loader, start=1):
        loss = model(**batch).loss
        loss.backward()
        monitor.after_backward(loss)
        optimizer.step()
        monitor.step()
        optimizer.zero_grad()
        if step == steps:
            break


def test_a_plain_loop_gets_the_same_records(workspace: Path, tmp_path: Path) -> None:
    tokenizer, model = _lora_model(workspace)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    monitor = LoopMonitor(model, optimizer, metrics_path=tmp_path / "m.jsonl")
    _loop(model, tokenizer, monitor, optimizer, steps=3)
    monitor.finish()
    steps = [r for r in read_metrics(tmp_path / "m.jsonl") if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["grad_norm"] > 0 and r["learning_rate"] == 1e-2 for r in steps)
    assert steps[0]["adapter_grad_norm"] > 0


def test_a_plain_loop_whose_adapters_freeze_mid_run_stops_with_g002(workspace: Path, tmp_path: Path) -> None:
    tokenizer, model = _lora_model(workspace)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    monitor = LoopMonitor(model, optimizer, metrics_path=tmp_path / "m.jsonl")
    layer0 = model.base_model.model.model.layers[0]
    layer0.requires_grad_(False)  # the model's own code freezing a sub-module, adapters included
    with pytest.raises(HealthStop) as stop:
        _loop(model, tokenizer, monitor, optimizer, steps=10)
    assert stop.value.event.code == "G002" and "layers.0" in stop.value.event.message
    assert monitor.global_step == 3


def test_a_plain_loop_whose_optimizer_misses_trainable_tensors_stops_before_step_one(workspace: Path) -> None:
    _, model = _lora_model(workspace)
    lora_a = [p for n, p in model.named_parameters() if "lora_A" in n]
    with pytest.raises(HealthStop) as stop:
        LoopMonitor(model, torch.optim.SGD(lora_a, lr=0.1))
    assert stop.value.event.code == "G003"


# A user's plain loop as docs/own-script.md shows it; it prints which heavy libraries it ended up with.
_LOOP_ONLY = """
import sys
import torch
from flightdeck.callback import LoopMonitor

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
monitor = LoopMonitor(model, optimizer, metrics_path=sys.argv[1])
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    monitor.after_backward(loss)
    optimizer.step()
    monitor.step()
    optimizer.zero_grad()
monitor.finish()
print(sorted(m for m in ("transformers", "peft", "bitsandbytes") if m in sys.modules))
"""


def test_a_plain_loops_loop_monitor_loads_nothing_of_transformers(tmp_path: Path) -> None:
    """LoopMonitor's import path loads the checks and the records only: transformers' trainer module
    brings peft and bitsandbytes (about 7 s here, bench/README.md "First step"), and a plain loop need not
    have them. (FlightdeckCallback, resolved when asked for, is imported from the same path above.)"""
    metrics = tmp_path / "metrics.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _LOOP_ONLY, str(metrics)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    assert [r["step"] for r in read_metrics(metrics) if r["type"] == "step"] == [1, 2, 3]


# A world of one over gloo; the first atexit handler registered runs last (LIFO): it sees whether the
# process group is still alive when interpreter teardown begins, where gloo's threads can abort it.
_EXIT_PROBE = """
import atexit, sys
import torch
import torch.distributed as dist
from flightdeck.callback import FlightdeckCallback, LoopMonitor

dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
atexit.register(lambda: print("alive at teardown:", dist.is_initialized(), flush=True))
if sys.argv[1] == "callback":
    FlightdeckCallback(metrics_path="{metrics}")
else:
    model = torch.nn.Linear(2, 2)
    LoopMonitor(model, torch.optim.SGD(model.parameters(), lr=0.1), metrics_path="{metrics}")
dist.all_reduce(torch.ones(1))  # work done through the group, as every DDP run has
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["callback", "loop"])
def test_the_process_group_is_ended_before_interpreter_teardown(kind: str, tmp_path: Path) -> None:
    """Regression: an HF Trainer script under torchrun trained to the end, then a rank died of SIGABRT
    in teardown with its gloo group alive (the Trainer never destroys it) and the job failed."""
    probe = _EXIT_PROBE.format(store=tmp_path / "store", metrics=tmp_path / "metrics.jsonl")
    done = subprocess.run(
        [sys.executable, "-c", probe, kind], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alive at teardown: False" in done.stdout, done.stdout + done.stderr[-3000:]
