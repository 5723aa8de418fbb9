"""Runs that cannot learn, with or without an adapter: H007 (every gradient exactly 0) and D005 at run time
(loss exactly 0 with no gradient: no supervised token), driven step by step."""

from __future__ import annotations

from typing import Any

from torch import nn

from flightdeck.recipe.schema import HealthSpec
from flightdeck.worker.train.health import HealthEvent, HealthMonitor


def _monitor(module: nn.Module, **health: Any) -> tuple[HealthMonitor, list[HealthEvent]]:
    events: list[HealthEvent] = []
    monitor = HealthMonitor(HealthSpec(**health), planned_steps_per_epoch=None, emit=events.append)
    monitor.check_model(module)
    return monitor, events


def _full_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


def _adapted() -> nn.Module:
    return nn.ModuleDict({"q": nn.ModuleDict({"base_layer": nn.Linear(4, 4), "lora_A": nn.Linear(4, 2)})})


def test_every_gradient_exactly_zero_without_an_adapter_is_h007_after_patience() -> None:
    monitor, _ = _monitor(_full_model(), zero_grad_patience=3)
    assert monitor.step_checks(1, 1, 6.17, 3.3, None) is None
    assert monitor.step_checks(2, 2, 6.19, 0.0, None) is None
    assert monitor.step_checks(3, 3, 6.19, 0.0, None) is None
    event = monitor.step_checks(4, 4, 6.19, 0.0, None)
    assert event is not None and (event.code, event.severity, event.step) == ("H007", "fatal", 4)
    assert "--learning_rate" in (event.fix or "") and "6.19" in event.message


def test_a_non_zero_gradient_resets_h007s_streak() -> None:
    monitor, _ = _monitor(_full_model(), zero_grad_patience=2)
    for step, norm in enumerate([0.0, 0.1, 0.0, 0.2, 0.0], start=1):
        assert monitor.step_checks(step, step, 1.0, norm, None) is None


def test_loss_exactly_zero_with_no_gradient_is_d005_with_or_without_an_adapter() -> None:
    for module in (_full_model(), _adapted()):
        monitor, _ = _monitor(module, zero_grad_patience=2)
        assert monitor.step_checks(1, 1, 0.0, 0.0, None) is None
        event = monitor.step_checks(2, 2, 0.0, 0.0, None)
        assert event is not None and (event.code, event.step) == ("D005", 2), event
        assert "-100" in event.message


def test_a_zero_loss_with_gradients_flowing_is_not_d005() -> None:
    monitor, _ = _monitor(_full_model(), zero_grad_patience=2)
    for step in range(1, 5):
        assert monitor.step_checks(step, step, 0.0, 0.5, None) is None


def test_an_unknown_loss_is_no_evidence_of_a_non_finite_one() -> None:
    # A plain loop whose backward the watch did not see: grad norms only, and no H001 for them.
    monitor, _ = _monitor(_full_model(), nonfinite_patience=1)
    assert monitor.step_checks(1, 1, None, 0.4, None) is None


def test_a_frozen_loss_while_gradients_flow_warns_h004_with_the_numbers() -> None:
    monitor, events = _monitor(_full_model(), flat_loss_patience=3)
    for step in range(1, 5):
        assert monitor.step_checks(step, step, 2.5, 0.75, None) is None
    (warning,) = [e for e in events if e.code == "H004"]
    assert "2.5" in warning.message and "0.75" in warning.message
