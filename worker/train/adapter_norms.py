"""The adapters' gradient norms at an optimizer step: in total and per adapted module (G002).

Measured at the steps the health monitor asks for (every step of a plain loop; a Trainer's first
steps and then a sample, HealthMonitor._plan_norms), read only when a step is judged: a measured step
pays one fused per-tensor norm and one stack, with no host sync; the read is one copy to the host,
where the per-module sums are taken in double precision (a handful to a few hundred numbers, cheaper
than the device ops they replace: each op costs 3-7 us of dispatch on a CPU step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


class AdapterGradNorms:
    """Gradient norms of `params` (the adapter tensors), each tensor in the group `groups[i]`."""

    def __init__(self, params: Sequence[torch.Tensor], groups: Sequence[int], group_count: int):
        if len(params) != len(groups):
            raise ValueError(f"{len(params)} adapter tensors but {len(groups)} group indices")
        self.params = list(params)
        self.groups = list(groups)
        self.group_count = group_count
        # A device-mapped model spreads adapters over GPUs: the per-tensor norms are gathered on one.
        self.spread = len({p.device for p in self.params}) > 1
        self.missing = 0  # adapter tensors without a gradient at the last step
        self._norms: torch.Tensor | None = None  # per-tensor norms of the last step, on the device
        self._present: list[int] | None = None  # the tensors that had a gradient (None: all of them)
        self._measured = False
        self.skipped = False  # the last step was not measured: nothing here is about it
        self._host: tuple[float | None, list[float]] | None = None

    def measure(self) -> None:
        """Take this step's per-tensor norms (before the optimizer steps and zero_grad clears them)."""
        grads = [p.grad for p in self.params]
        present = None  # every adapter tensor has a gradient: the usual case
        if any(g is None for g in grads):
            present = [i for i, g in enumerate(grads) if g is not None]
            grads = [grads[i] for i in present]
        self.missing = len(self.params) - len(grads)
        self._present, self._measured, self._host = present, True, None
        self.skipped = False
        if not grads:
            self._norms = None
            return
        norms = torch._foreach_norm(grads)
        if self.spread:
            norms = [n.to(grads[0].device, torch.float32) for n in norms]
        self._norms = torch.stack(norms)

    def skip(self) -> None:
        """This step is not measured: what was read before stays, marked as not this step's."""
        self.skipped = True

    def total(self) -> float | None:
        """The norm over every adapter tensor at the last step; None when none had a gradient."""
        return self._read()[0]

    def group_squares(self) -> list[float] | None:
        """Squared norm per group at the last step (0.0 for a group with no gradient); None before any step
        and for a step that was not measured."""
        return self._read()[1] if self._measured and not self.skipped else None

    def _read(self) -> tuple[float | None, list[float]]:
        if self._host is None:
            sums = [0.0] * self.group_count
            if self._norms is None:
                self._host = (None, sums)
            else:
                which = self.groups if self._present is None else [self.groups[i] for i in self._present]
                for group, norm in zip(which, self._norms.tolist(), strict=True):  # one copy to the host
                    sums[group] += norm * norm
                self._host = (math.sqrt(math.fsum(sums)), sums)
        return self._host
