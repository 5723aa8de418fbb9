"""A step's total gradient norm (worker/train/grad_norms.py) against torch's own, on the gradients a
real LoRA model leaves: mixed dtypes, transposed (non-contiguous) views, one tensor or many."""

from __future__ import annotations

import math

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from flightdeck.worker.train.grad_norms import joined_norm, joins, total_norm


def _lora_gradients() -> list[torch.Tensor]:
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    torch.manual_seed(0)
    model = get_peft_model(
        LlamaForCausalLM(config),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    return [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]


def _reference(grads: list[torch.Tensor]) -> float:
    return math.sqrt(math.fsum(float(g.double().pow(2).sum()) for g in grads))


@pytest.mark.parametrize("norm", [total_norm, joined_norm])
def test_the_norm_of_a_lora_models_gradients_is_torchs(norm) -> None:
    grads = _lora_gradients()
    assert len(grads) == 8  # A and B of q_proj and v_proj in two layers
    assert float(norm(grads)) == pytest.approx(_reference(grads), rel=1e-6)
    assert float(norm(grads)) == pytest.approx(float(torch.nn.utils.get_total_norm(grads)), rel=1e-6)


@pytest.mark.parametrize("norm", [total_norm, joined_norm])
def test_mixed_dtypes_and_transposed_views_count_every_element(norm) -> None:
    torch.manual_seed(1)
    grads = [
        torch.randn(6, 4).t(),  # a view with strides, as a tied or transposed weight's gradient can be
        torch.randn(5, dtype=torch.bfloat16),
        torch.randn(3, 2, 2, dtype=torch.float16),
        torch.randn(1),
    ]
    result = norm(grads)
    assert result.dtype == torch.float32
    assert float(result) == pytest.approx(_reference(grads), rel=1e-3)


def test_bf16_adapters_gradients_are_joined_and_summed_in_float32() -> None:
    # 300 equal values: a bf16 result (8 bits of mantissa) would be 0.3 % off the exact 17.3205...
    grads = [torch.ones(100, dtype=torch.bfloat16), torch.ones(2, 100, dtype=torch.bfloat16)]
    assert joined_norm(grads).dtype == torch.float32
    assert float(joined_norm(grads)) == pytest.approx(math.sqrt(300), rel=1e-6)
    # Per tensor in bf16 (the norm of 200 ones, 14.142..., is 14.125 in bf16), then summed in float32.
    assert total_norm(grads).dtype == torch.float32
    assert float(total_norm(grads)) == pytest.approx(math.sqrt(300), rel=4e-3)


@pytest.mark.parametrize("norm", [total_norm, joined_norm])
def test_zero_and_non_finite_gradients_stay_what_they_are(norm) -> None:
    # G002 reads an exact zero; H001 a non-finite norm.
    assert float(norm([torch.zeros(3, 3), torch.zeros(4)])) == 0.0
    assert math.isinf(float(norm([torch.ones(2), torch.tensor([float("inf")])])))
    assert math.isnan(float(norm([torch.ones(2), torch.tensor([float("nan")])])))


def test_small_tensors_on_the_cpu_are_joined_large_ones_and_other_devices_are_not() -> None:
    lora_tiny = [torch.zeros(8, 64), torch.zeros(64, 8)] * 4  # the benchmark's tiny model: 512 each
    lora_7b = [torch.zeros(16, 4096, device="meta"), torch.zeros(4096, 16, device="meta")]  # 65,536 each
    assert joins(lora_tiny)
    assert not joins([torch.zeros(16, 4096, dtype=torch.bfloat16), torch.zeros(4096, 16)])
    assert not joins(lora_7b) and not joins([torch.zeros(8, device="meta")])  # not the CPU
    assert not joins([])
