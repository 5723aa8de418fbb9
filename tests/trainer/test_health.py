"""The run-time health checks, driven step by step without a training loop."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from flightdeck.recipe import parse_recipe
from flightdeck.worker.train.health import HealthEvent, HealthMonitor, HealthStop


def _recipe(**health: Any):  # type: ignore[no-untyped-def]
    return parse_recipe(
        {
            "name": "t",
            "model": {"path": "m", "freeze": ["lora_"]},
            "data": {"train": [{"path": "d.jsonl"}]},
            "training": {"max_grad_norm": 1.0},
            "health": health,
        }
    )


def _adapted_module() -> nn.Module:
    """Parameter names like PEFT's: q.base_layer.weight, q.lora_A.weight, q.lora_B.weight."""
    return nn.ModuleDict(
        {
            "q": nn.ModuleDict(
                {"base_layer": nn.Linear(4, 4), "lora_A": nn.Linear(4, 2), "lora_B": nn.Linear(2, 4)}
            )
        }
    )


def _monitor(
    module: nn.Module | None = None, planned: int = 10, **health: Any
) -> tuple[HealthMonitor, list[HealthEvent]]:
    events: list[HealthEvent] = []
    monitor = HealthMonitor.for_recipe(_recipe(**health), planned_steps_per_epoch=planned, emit=events.append)
    monitor.check_model(module if module is not None else _adapted_module())
    return monitor, events


def test_zero_adapter_gradient_is_fatal_after_patience_but_never_at_step_one() -> None:
    monitor, _ = _monitor(zero_grad_patience=2)
    assert monitor.step_checks(1, 1, 2.0, 0.5, 0.0) is None  # lora_B starts at 0: exempt
    assert monitor.step_checks(2, 2, 2.0, 0.5, 0.0) is None
    event = monitor.step_checks(3, 3, 2.0, 0.5, None)
    assert event is not None and (event.code, event.severity) == ("G002", "fatal")
    assert "re-enable requires_grad" in (event.fix or "")


def test_a_non_zero_adapter_gradient_resets_the_zero_streak() -> None:
    monitor, _ = _monitor(zero_grad_patience=2)
    for step, norm in enumerate([0.0, 0.3, 0.0, 0.2, 0.0], start=2):
        assert monitor.step_checks(step, step, 2.0, 0.5, norm) is None


def test_adapter_norm_is_measured_on_gradients_and_unclipped() -> None:
    module = _adapted_module()
    monitor, _ = _monitor(module)
    monitor.on_pre_optimizer_step(None, None, None)
    assert monitor.adapter_grad_norm(0.5) is None  # no gradient at all
    module["q"]["lora_A"].weight.grad = torch.full((2, 4), 0.5)
    monitor.on_pre_optimizer_step(None, None, None)
    assert monitor.adapter_grad_norm(0.5) == pytest.approx(math.sqrt(8 * 0.25))
    # The Trainer clipped a total norm of 4 to 1 before this callback: undo that factor.
    assert monitor.adapter_grad_norm(4.0) == pytest.approx(math.sqrt(2) * 4, rel=1e-5)


def test_non_finite_loss_is_fatal_after_patience() -> None:
    monitor, _ = _monitor(nonfinite_patience=2)
    assert monitor.step_checks(1, 1, float("nan"), 1.0, 1.0) is None
    event = monitor.step_checks(2, 2, 3.0, float("inf"), 1.0)
    assert event is not None and event.code == "H001"


def test_grad_norm_above_limit_warns_once_then_stops_when_sustained() -> None:
    monitor, events = _monitor(grad_norm_limit=10.0, grad_norm_patience=3)
    assert monitor.step_checks(1, 1, 2.0, 20.0, 1.0) is None
    assert monitor.step_checks(2, 2, 2.0, 5.0, 1.0) is None  # resets
    assert monitor.step_checks(3, 3, 2.0, 20.0, 1.0) is None
    assert monitor.step_checks(4, 4, 2.0, 30.0, 1.0) is None
    event = monitor.step_checks(5, 5, 2.0, 40.0, 1.0)
    assert event is not None and event.code == "H002"
    assert [(e.code, e.severity) for e in events] == [("H002", "warn")]


def test_flat_loss_warns() -> None:
    monitor, events = _monitor(flat_loss_patience=3)
    for step in range(1, 5):
        assert monitor.step_checks(step, step, 1.5, 0.5, 0.5) is None
    assert [(e.code, e.severity) for e in events] == [("H004", "warn")]


def test_no_trainable_parameters_stops_before_step_one_naming_the_pattern() -> None:
    module = _adapted_module()
    module.requires_grad_(False)
    with pytest.raises(HealthStop) as caught:
        _monitor(module)
    event = caught.value.event
    assert event.code == "G001"
    assert "'lora_'" in (event.fix or "")
    assert event.data["frozen_adapter_tensors"] == [
        "q.lora_A.weight",
        "q.lora_A.bias",
        "q.lora_B.weight",
        "q.lora_B.bias",
    ]


def _args(**kw: Any) -> SimpleNamespace:
    return SimpleNamespace(
        **({"n_gpu": 0, "gradient_accumulation_steps": 1, "device": torch.device("cpu")} | kw)
    )


def test_data_parallel_wrapper_is_p002() -> None:
    module = _adapted_module()
    monitor, _ = _monitor(module)
    monitor.trainer = SimpleNamespace(model_wrapped=nn.DataParallel(module))
    event = monitor.start_checks(list(module.named_parameters()), None, None, _args())
    assert event is not None and event.code == "P002"


def test_trainer_steps_per_epoch_differing_from_the_plan_is_p002() -> None:
    # R2's telltale: 68 steps where the recipe implies 136 (the batch silently doubled).
    module = _adapted_module()
    monitor, _ = _monitor(module, planned=136)
    monitor.trainer = SimpleNamespace(model_wrapped=module)
    event = monitor.start_checks(list(module.named_parameters()), None, list(range(68)), _args())
    assert event is not None and event.code == "P002"
    assert event.data == {"trainer_steps_per_epoch": 68, "planned_steps_per_epoch": 136}
    assert monitor.start_checks(list(module.named_parameters()), None, list(range(136)), _args()) is None


def test_optimizer_missing_trainable_parameters_is_g003() -> None:
    module = _adapted_module()
    monitor, _ = _monitor(module)
    named = list(module.named_parameters())
    optimizer = torch.optim.SGD([p for n, p in named if "lora_A" in n], lr=0.1)
    event = monitor.start_checks(named, optimizer, None, _args())
    assert event is not None and event.code == "G003"
    assert "q.lora_B.weight" in event.data["not_in_optimizer"]
    assert monitor.start_checks(named, torch.optim.SGD(module.parameters(), lr=0.1), None, _args()) is None


@pytest.mark.parametrize(
    ("wrapper", "world_size", "said"),
    [
        ("DistributedDataParallel", 1, "over 1 process (torchrun's group of one: no replica)"),
        ("DistributedDataParallel", 2, "over 2 processes"),
        ("PeftModelForCausalLM", 1, "model wrapped as PeftModelForCausalLM"),
    ],
)
def test_the_training_started_line_says_a_one_process_ddp_has_no_replica(
    wrapper: str, world_size: int, said: str
) -> None:
    from flightdeck.worker.train.health import wrapping_description

    assert said in wrapping_description(wrapper, world_size)


def _two_adapted_modules() -> nn.Module:
    return nn.ModuleDict({name: _adapted_module()["q"] for name in ("q", "v")})


@pytest.mark.parametrize(
    ("adapted", "fatal_streak"),
    [
        (True, [(float("nan"), 1.0, 1.0), (2.0, float("inf"), 1.0)]),  # H001
        (True, [(2.0, 0.5, 0.0), (2.0, 0.5, None), (2.0, 0.5, 0.0)]),  # G002
        (True, [(2.0, 1e9, 1.0), (2.0, 2e9, 1.0), (2.0, 3e9, 1.0)]),  # H002
        (True, [(0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)]),  # D005
        (False, [(2.0, 0.0, None), (2.0, 0.0, None), (2.0, 0.0, None)]),  # H007: no gradient, no adapter
    ],
)
def test_no_step_on_the_way_to_a_fatal_finding_may_wait_to_be_judged(
    adapted: bool, fatal_streak: list[tuple[float, float, float | None]]
) -> None:
    """A plain loop's quick steps are judged later only when HealthMonitor.can_wait says so: every step
    of a streak that ends in a stop must be judged at once, and a healthy step may wait; while the
    streak is open, quiet_steps lets no step go by unseen."""
    monitor, _ = _monitor(None if adapted else nn.Linear(4, 4), nonfinite_patience=2, zero_grad_patience=3)
    monitor.health.grad_norm_limit, monitor.health.grad_norm_patience = 1000.0, 3
    assert monitor.can_wait(2.0, 0.5, 0.3 if adapted else None)
    assert monitor.step_checks(1, 1, 2.0, 0.5, 0.3 if adapted else None) is None
    events = []
    for step, (loss, norm, adapter_norm) in enumerate(fatal_streak, start=2):
        assert not monitor.can_wait(loss, norm, adapter_norm), (loss, norm, adapter_norm)
        events.append(monitor.step_checks(step, step, loss, norm, adapter_norm))
        if events[-1] is None:  # a streak is open: no step may go by unseen (the loop watch's held ones)
            assert monitor.quiet_steps() == 0
    assert events[-1] is not None and events[-1].severity == "fatal"


def test_a_step_whose_per_module_norms_were_measured_cannot_wait_and_an_older_one_judged_after_it_does_not_read_them() -> (
    None
):
    """Adapters of two modules, one of them dead: measured steps are judged at once; a step judged after
    a later, measured one (a batch's) does not count that step's dead module a second time."""
    module = _two_adapted_modules()
    monitor, _ = _monitor(module, zero_grad_patience=2)

    def measured_step() -> None:  # q's adapters get a gradient, v's none
        for part in ("lora_A", "lora_B"):
            module["q"][part].weight.grad = torch.full_like(module["q"][part].weight, 0.1)
        monitor.on_pre_optimizer_step(None, None, None)

    measured_step()
    assert not monitor.can_wait(2.0, 0.5, monitor.adapter_grad_norm(0.5))
    assert monitor.step_checks(2, 2, 2.0, 0.5, monitor.adapter_grad_norm(0.5)) is None  # v: 1 step dead
    measured_step()
    older = monitor.step_checks(3, 3, 2.0, 0.5, 0.4, its_norms=False)  # waited; the norms are step 4's
    assert older is None
    event = monitor.step_checks(4, 4, 2.0, 0.5, monitor.adapter_grad_norm(0.5))
    assert event is not None and event.code == "G002" and event.step == 4
