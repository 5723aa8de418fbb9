"""D004 at train begin: the dataset as a spawned DataLoader worker will receive it (R3).

A loader whose workers start by spawn (or forkserver) sends each worker a pickled copy of the dataset.
A dataset that keeps its rows in a field its pickling drops (a `__getstate__` that leaves out a cache,
a handle reopened lazily but never) arrives empty: R3's `ValueError: The batch received was empty`
some seconds later, or `Example keys: []`. Round-tripping the dataset through pickle once, as the
workers will, shows it before the first step. Fork copies the process instead (nothing pickled), so
such a loader is left alone; so is a stream (no length to compare).
"""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

from flightdeck.worker.train.health import HealthEvent

CODE = "D004"
FIX = (
    "keep what a sample needs in the dataset's pickled state (or reload it from a path in __setstate__); "
    "or let the loader fork (dataloader_num_workers with the default start method), or num_workers 0"
)


def _start_method(loader: Any) -> str | None:
    context = getattr(loader, "multiprocessing_context", None)
    if context is not None:
        return str(context.get_start_method())
    return (
        multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()
    )


def _empty(sample: Any) -> bool:
    return sample is None or (hasattr(sample, "__len__") and len(sample) == 0)


def spawned_dataset_event(loader: Any) -> HealthEvent | None:
    """A fatal D004 when the dataset a spawned worker receives is empty while the loader's is not."""
    if loader is None or not getattr(loader, "num_workers", 0):
        return None
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        return None
    if _start_method(loader) == "fork":
        return None
    try:
        size = len(dataset)
        if size == 0 or _empty(dataset[0]):
            return None  # empty in the parent too: not pickling's doing (D007 / D008 say why)
        copy = pickle.loads(pickle.dumps(dataset))
        copied = len(copy)
        first = copy[0] if copied else None
    except Exception as exc:  # a copy that cannot be made or read fails the workers the same way
        return _event(
            type(dataset).__name__, f"its pickled copy cannot be read ({type(exc).__name__}: {exc})"
        )
    if copied == 0:
        return _event(type(dataset).__name__, f"its pickled copy holds 0 of {size:,} samples")
    if _empty(first):
        return _event(
            type(dataset).__name__, f"the first sample of its pickled copy is empty ({first!r:.60})"
        )
    return None


def _event(name: str, what: str) -> HealthEvent:
    return HealthEvent(
        CODE,
        "fatal",
        f"the training dataset ({name}) arrives empty in the DataLoader's spawned workers: {what}",
        fix=FIX,
        step=0,
    )
