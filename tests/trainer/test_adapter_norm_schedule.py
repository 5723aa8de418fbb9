"""Which optimizer steps take the adapters' per-tensor norms in a Trainer's run, and that the checks
they feed (G002 in total and per module) still stop a run: the first steps, a sample after them, and
every step while a zero streak is open. Driven in the Trainer's order (backward, clip, pre-optimizer
step, optimizer step, zero_grad, log) on a real peft LoRA model, without a Trainer."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from flightdeck.recipe.schema import HealthSpec
from flightdeck.worker.train import health as health_module
from flightdeck.worker.train.health import HealthEvent, HealthMonitor, HealthStop

from .test_adapter_norms import _lora_model

EVERY_STEP_FOR = HealthMonitor.NORMS_EVERY_STEP_FOR
SAMPLE_EVERY = HealthMonitor.NORMS_SAMPLE_EVERY


class _Run:
    """A LoRA model trained step by step the way the HF Trainer calls its callbacks."""

    def __init__(self, model: nn.Module | None = None, *, log_grad_norm: bool = True, **health: Any):
        self.model = model if model is not None else _lora_model()
        self.events: list[HealthEvent] = []
        self.monitor = HealthMonitor(
            HealthSpec(**health), planned_steps_per_epoch=None, emit=self.events.append, max_grad_norm=1.0
        )
        args = SimpleNamespace(
            device=torch.device("cpu"), world_size=1, n_gpu=1, gradient_accumulation_steps=1
        )
        self.args = args
        self.state = SimpleNamespace(global_step=0, max_steps=100)
        self.monitor.on_train_begin(args, self.state, None, model=self.model)
        self.optimizer = torch.optim.SGD([p for p in self.model.parameters() if p.requires_grad], lr=1e-3)
        self.log_grad_norm = log_grad_norm
        self.measured: list[int] = []
        self.records: list[dict[str, Any]] = []
        measure = self.monitor._norms.measure

        def counted() -> None:
            self.measured.append(self.state.global_step + 1)
            measure()

        self.monitor._norms.measure = counted  # type: ignore[method-assign]

    def step(self, before_backward: Callable[[int], None] | None = None) -> None:
        step = self.state.global_step + 1
        torch.manual_seed(step)
        loss = self.model(torch.randn(5, 16)).pow(2).mean()
        loss.backward()
        if before_backward is not None:
            before_backward(step)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))  # the pre-clip norm
        self.monitor.on_pre_optimizer_step(self.args, self.state, None)
        self.optimizer.step()
        self.model.zero_grad(set_to_none=True)
        self.state.global_step = step
        logs = {"loss": loss.item(), "learning_rate": 1e-3, "epoch": step / 100}
        if self.log_grad_norm:
            logs["grad_norm"] = grad_norm
        self.records.append(
            {"step": step, "grad_norm": grad_norm, "adapter": self.monitor.adapter_grad_norm(grad_norm)}
        )
        self.monitor.on_log(self.args, self.state, None, logs=logs)


def _cut(run: _Run, marker: str, from_step: int) -> Callable[[int], None]:
    """From `from_step` on, the adapters of the modules named by `marker` get no gradient (a part the
    model's code started running under torch.no_grad())."""
    params = [p for n, p in run.model.named_parameters() if marker in n and "lora_" in n]

    def cut(step: int) -> None:
        if step >= from_step:
            for param in params:
                param.grad = None

    return cut


def test_a_lora_only_run_measures_its_first_steps_then_one_judged_step_in_ten() -> None:
    run = _Run()
    for _ in range(40):
        run.step()
    assert run.measured == [*range(1, EVERY_STEP_FOR + 1), 20, 30, 40]
    # Between samples the adapters' total is the Trainer's own pre-clip norm over the same tensors.
    for record in run.records:
        assert record["adapter"] == pytest.approx(record["grad_norm"], rel=1e-5)
    assert [r["adapter"] == r["grad_norm"] for r in run.records[EVERY_STEP_FOR:19]] == [True] * 9


def _stopped_after_cut(run: _Run, module: str, from_step: int) -> Any:
    """The fatal event of a run whose `module`'s gradient is cut from `from_step` on."""
    cut = _cut(run, module, from_step=from_step)
    with pytest.raises(HealthStop) as stopped:
        for _ in range(40):
            run.step(cut)
    return stopped.value.event


def test_a_module_cut_off_after_the_first_steps_stops_at_the_next_sample_plus_patience() -> None:
    run = _Run(zero_grad_patience=2)
    event = _stopped_after_cut(run, "0.v_proj", from_step=14)
    # Sampled at 20 (dead: the streak opens), measured again at 21 because it is open: fatal at 21.
    assert (event.code, event.step) == ("G002", 21)
    assert event.data["dead_modules"] == ["0.v_proj"]
    assert run.measured[-2:] == [20, 21]


def test_every_adapter_dead_after_the_first_steps_stops_after_patience_from_the_trainers_norm() -> None:
    run = _Run(zero_grad_patience=2)
    event = _stopped_after_cut(run, ".", from_step=15)
    # Step 15 is not measured: its logged grad_norm 0.0 is the adapters' total; the open streak has 16 measured.
    assert (event.code, event.step) == ("G002", 16)
    assert 15 not in run.measured and 16 in run.measured
    assert "8 without a gradient" in event.message


def test_a_run_training_more_than_adapters_measures_every_step() -> None:
    model = _lora_model()
    model.base_model.model[0].out.weight.requires_grad_(True)  # a trainable tensor that is no adapter's
    run = _Run(model)
    for _ in range(25):
        run.step()
    assert run.measured == list(range(1, 26))


def test_a_trainer_that_logs_no_grad_norm_measures_every_step() -> None:
    run = _Run(log_grad_norm=False)
    for _ in range(25):
        run.step()
    assert run.measured == list(range(1, 26))


def test_a_log_without_grad_norm_after_a_skipped_step_is_no_evidence_of_dead_adapters() -> None:
    run = _Run(zero_grad_patience=1)
    for _ in range(12):
        run.step()
    assert 12 not in run.measured
    run.log_grad_norm = False  # step 12 was not measured and its log brings no norm: unknown, not zero
    run.step()
    run.step()
    assert not [e for e in run.events if e.code == "G002"]


def test_one_process_asks_no_other_rank_at_a_healthy_step(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[HealthEvent | None] = []
    agreed = health_module.agreed_fatal

    def counted(event: HealthEvent | None, device: torch.device) -> HealthEvent | None:
        asked.append(event)
        return agreed(event, device)

    monkeypatch.setattr(health_module, "agreed_fatal", counted)
    run = _Run(zero_grad_patience=1)
    asked.clear()  # train begin's checks agree once, whatever the world
    for _ in range(3):
        run.step()
    assert asked == []
    with pytest.raises(HealthStop):
        run.step(_cut(run, ".", from_step=4))
    assert [e.code for e in asked if e is not None] == ["G002"]  # a finding still goes through agreement
