"""Whether the HF Trainer passes loss kwargs (`num_items_in_batch`) to a model's forward (G015).

Shared by the host rule (the probe's meta-device model) and FlightdeckCallback (a script's own model).
"""

from __future__ import annotations

import inspect
from typing import Any


def accepts_loss_kwargs(model: Any) -> bool:
    """What the HF Trainer decides (Trainer.__init__, 'Model introspection'): the class's own
    `accepts_loss_kwargs` where it declares one, else whether forward takes **kwargs."""
    declared = getattr(model, "accepts_loss_kwargs", None)
    if declared is not None:
        return bool(declared)
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)


def accumulation_event(model: Any, accumulation_steps: int) -> Any:
    """G015 as a run-time warning for a script job: the Trainer's own model and accumulation."""
    from peft import PeftModel

    from flightdeck.worker.train.health import HealthEvent

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    if accumulation_steps <= 1 or base is None or accepts_loss_kwargs(base):
        return None
    return HealthEvent(
        "G015",
        "warn",
        f"gradient_accumulation_steps is {accumulation_steps} but {type(base).__name__}.forward takes no "
        "loss kwargs (num_items_in_batch): the Trainer averages each micro-batch's mean loss instead of "
        "normalising over the supervised tokens of the whole accumulated batch (transformers#35203)",
        fix="accept **kwargs in forward and pass num_items_in_batch to the loss (sum / num_items_in_batch), "
        f"or set gradient_accumulation_steps=1 with a per-device batch {accumulation_steps}x larger",
        step=0,
        data={"model_class": type(base).__name__},
    )
