"""A step's total gradient norm, in one place for the plain-loop watch and LoopMonitor.

Two ways, each a fixed handful of op dispatches whatever the number of tensors (on a CPU step an op
costs 2-5 us of dispatch, so a per-tensor op in a list comprehension over a model's hundreds of
tensors would cost more than the norm):
- `total_norm`: torch's fused per-tensor norm (what `clip_grad_norm_` uses), no copy of the gradients.
  On a GPU one fused kernel; on the CPU a loop of one kernel per tensor, about 3 us each.
- `joined_norm`: the gradients copied into one vector by one call, then one norm. On the CPU the
  cheaper way for small tensors (a tiny model's LoRA, where the per-tensor kernels cost more than
  the copy), the dearer one for large ones: 128 tensors of 32,768 elements took 2.9-3.5 ms joined
  against 1.6-2.0 ms fused, 448 of 65,536 100 ms against 9-11 ms (the 2-core CPU machine).
`joins` picks between them once, from the tensors a run trains.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._utils import _flatten_dense_tensors

# The mean elements per tensor up to which joining is the cheaper way on the CPU: 128 tensors of
# 8,192 took 0.40 ms joined against 0.57 ms fused, of 32,768 3.2 ms against 1.8 ms.
JOIN_UP_TO_ELEMENTS = 16_384


def joins(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether `joined_norm` is the cheaper way for these tensors' gradients: all on the CPU, small."""
    if not tensors or any(t.device.type != "cpu" for t in tensors):
        return False
    return sum(t.numel() for t in tensors) <= JOIN_UP_TO_ELEMENTS * len(tensors)


def total_norm(grads: Sequence[torch.Tensor], *, spread: bool = False) -> torch.Tensor:
    """The 2-norm over `grads`, any size: one fused norm per tensor (in the gradients' dtype: bf16's is
    within 0.4 %), summed in float32. `spread`: the tensors are on several devices (a device-mapped
    model), and their norms are gathered on the first's."""
    norms = torch._foreach_norm(list(grads))
    if spread:
        norms = [n.to(norms[0].device) for n in norms]
    return torch.linalg.vector_norm(torch.stack(norms), dtype=torch.float32)


def joined_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The 2-norm over small `grads` on one device: joined into one vector by one call (as DDP's
    buckets are), then one norm, in float32 (bf16 adapters' too)."""
    return torch.linalg.vector_norm(_flatten_dense_tensors(list(grads)), dtype=torch.float32)
