"""V006: a model whose forward returns a tuple or a custom output type where the Trainer expects a loss.

R1's model returned its own output class with extra fields; DDP rebuilt it on the way out and failed
(`unexpected keyword argument 'new_input_ids'`), and a tuple whose first item is not the loss trains on
the logits. A forward hook on the model turns such an output into a plain CausalLMOutput (loss, logits)
before DDP or the Trainer see it, and says once what it converted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

_STANDARD_MODULE = "transformers."


def loss_of(output: Any) -> torch.Tensor | None:
    """The scalar loss in a model output: a 'loss' key or attribute, or the first 0-d tensor of a tuple."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, (tuple, list)):
        return next((item for item in output if isinstance(item, torch.Tensor) and item.dim() == 0), None)
    return None


def _logits_of(output: Any) -> torch.Tensor | None:
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)):
        logits = next((item for item in output if isinstance(item, torch.Tensor) and item.dim() > 1), None)
    return logits


class TolerantLoss:
    """Forward hook: non-standard outputs become CausalLMOutput(loss, logits); `note` runs once (the
    trainer points it at its event stream once that exists)."""

    def __init__(self, note: Callable[[str], None] | None = None):
        self.note: Callable[[str], None] = note or (lambda message: None)
        self.converted: str | None = None

    def __call__(self, module: torch.nn.Module, args: Any, output: Any) -> Any:
        from transformers.modeling_outputs import CausalLMOutput

        if type(output).__module__.startswith(_STANDARD_MODULE):
            return None  # a transformers output: the Trainer and DDP handle it
        loss = loss_of(output)
        if loss is None:
            return None
        if self.converted is None:
            self.converted = type(output).__name__
            self.note(
                f"the model returned a {self.converted} where a loss was expected; the loss was taken from "
                "it and passed on as a plain CausalLMOutput(loss, logits) (extra fields dropped)"
            )
        return CausalLMOutput(loss=loss, logits=_logits_of(output))


def attach_tolerant_loss(model: torch.nn.Module, note: Callable[[str], None] | None = None) -> TolerantLoss:
    hook = TolerantLoss(note)
    model.register_forward_hook(hook)
    return hook
