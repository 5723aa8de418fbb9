"""The adapters' gradient norms, taken with one fused norm per step and summed per module on the host,
against the same norms taken the slow way: one parameter at a time."""

from __future__ import annotations

import math

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from flightdeck.recipe.schema import HealthSpec
from flightdeck.worker.train.adapter_norms import AdapterGradNorms
from flightdeck.worker.train.health import HealthMonitor, adapted_module_name, is_adapter_param


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(16, 16)
        self.v_proj = nn.Linear(16, 8)
        self.out = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.v_proj(torch.relu(self.q_proj(x)))))


def _lora_model(seed: int = 0) -> nn.Module:
    """Two blocks under real peft LoRA; lora_B is randomised so that every adapter gets a gradient."""
    torch.manual_seed(seed)
    model = nn.Sequential(_Block(), _Block())
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    peft_model = get_peft_model(model, config)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(param)
    return peft_model


def _backward(model: nn.Module, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    model(torch.randn(5, 16)).pow(2).mean().backward()


def _monitor(model: nn.Module) -> HealthMonitor:
    monitor = HealthMonitor(HealthSpec(), planned_steps_per_epoch=None, emit=lambda event: None)
    monitor.take_inventory(model)
    return monitor


def _one_at_a_time(model: nn.Module) -> tuple[float, dict[str, float]]:
    """The total adapter norm and each adapted module's squared norm, parameter by parameter."""
    per_module: dict[str, float] = {}
    total = 0.0
    for name, param in model.named_parameters():
        if not is_adapter_param(name):
            continue
        square = float(param.grad.double().pow(2).sum()) if param.grad is not None else 0.0
        module = adapted_module_name(name)
        per_module[module] = per_module.get(module, 0.0) + square
        total += square
    return math.sqrt(total), per_module


def test_the_fused_norms_equal_the_per_parameter_norms_in_total_and_per_module() -> None:
    model = _lora_model()
    monitor = _monitor(model)
    _backward(model)
    monitor.on_pre_optimizer_step(None, None, None)
    total, per_module = _one_at_a_time(model)
    assert monitor.adapter_grad_norm(None) == pytest.approx(total, rel=1e-6)
    squares = monitor._norms.group_squares()
    assert squares is not None and len(squares) == 4  # q_proj and v_proj of two blocks
    assert dict(zip(monitor._groups, squares, strict=True)) == pytest.approx(per_module, rel=1e-5)
    assert all(square > 0 for square in squares)


def test_each_step_is_read_afresh_not_from_the_previous_steps_copy() -> None:
    model = _lora_model()
    monitor = _monitor(model)
    _backward(model, seed=1)
    monitor.on_pre_optimizer_step(None, None, None)
    first = monitor.adapter_grad_norm(None)
    _backward(model, seed=2)
    monitor.on_pre_optimizer_step(None, None, None)
    assert monitor.adapter_grad_norm(None) == pytest.approx(_one_at_a_time(model)[0], rel=1e-6)
    assert monitor.adapter_grad_norm(None) != first


def test_a_module_whose_adapters_have_no_gradient_sums_to_zero_and_is_counted_missing() -> None:
    model = _lora_model()
    monitor = _monitor(model)
    _backward(model)
    cut = [p for n, p in model.named_parameters() if ".0.v_proj.lora_" in n]
    for param in cut:
        param.grad = None  # as if run under torch.no_grad()
    monitor.on_pre_optimizer_step(None, None, None)
    total, per_module = _one_at_a_time(model)
    assert monitor.adapter_grad_norm(None) == pytest.approx(total, rel=1e-6)
    squares = dict(zip(monitor._groups, monitor._norms.group_squares() or [], strict=True))
    assert [module for module, square in squares.items() if square == 0] == ["0.v_proj"]
    assert squares == pytest.approx(per_module, rel=1e-5)
    assert monitor._norms.missing == len(cut) == 2


def test_no_gradient_at_all_is_no_norm_and_every_module_at_zero() -> None:
    model = _lora_model()
    monitor = _monitor(model)
    assert monitor._norms.group_squares() is None  # before any step: nothing to judge
    monitor.on_pre_optimizer_step(None, None, None)
    assert monitor.adapter_grad_norm(None) is None
    assert monitor._norms.group_squares() == [0.0] * 4


def test_a_non_finite_gradient_is_a_non_finite_norm_not_a_dead_module() -> None:
    model = _lora_model()
    monitor = _monitor(model)
    _backward(model)
    next(p for n, p in model.named_parameters() if ".1.q_proj.lora_A" in n).grad[0, 0] = math.nan
    monitor.on_pre_optimizer_step(None, None, None)
    assert math.isnan(monitor.adapter_grad_norm(None) or 0.0)
    assert not any(square == 0 for square in monitor._norms.group_squares() or [0.0])


def test_a_group_index_per_tensor_is_required() -> None:
    with pytest.raises(ValueError, match="2 adapter tensors but 1 group indices"):
        AdapterGradNorms([torch.zeros(1), torch.zeros(1)], [0], 1)


@pytest.mark.parametrize("prefix", ["", "base_model.model.", "module.", "module.base_model.model."])
def test_an_adapted_module_is_named_the_same_through_peft_and_ddp_wrappers(prefix: str) -> None:
    """G002 names modules as the base model names them, whichever wrapper the tensors were listed from."""
    name = f"{prefix}model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert adapted_module_name(name) == "model.layers.0.self_attn.q_proj"
