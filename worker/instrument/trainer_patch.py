"""Every HF `Trainer` the script builds (TRL's and other subclasses included) gets FlightdeckCallback.

`Trainer.__init__` is wrapped once, when transformers.trainer is first imported: subclasses call it
through super(), so they are covered too. A Trainer that already has the callback gets no second one.
transformers 5 defaults `report_to="none"`, so the callback is added directly, never through it.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any

from flightdeck.worker.instrument import loop_watch


def patch(module: ModuleType) -> None:
    trainer_class = module.Trainer
    original = trainer_class.__init__
    if getattr(original, "flightdeck", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        loop_watch.WATCH.stand_down("an HF Trainer reports through FlightdeckCallback")
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["callbacks"] = with_callback(bound.arguments.get("callbacks"))
        original(*bound.args, **bound.kwargs)

    __init__.flightdeck = True  # type: ignore[attr-defined]
    trainer_class.__init__ = __init__


def with_callback(callbacks: list[Any] | None) -> list[Any]:
    """The script's callbacks plus one FlightdeckCallback, unless it gave one (an instance or the class)."""
    from flightdeck.worker.callback import FlightdeckCallback

    given = list(callbacks or [])
    if any(c is FlightdeckCallback or isinstance(c, FlightdeckCallback) for c in given):
        return given
    return [*given, FlightdeckCallback()]
