"""The seed a DataLoader worker of the recipe trainer starts from, set from a module a worker imports at once.

transformers' Trainer gives its training loader `partial(seed_worker, ...)` from
`transformers.trainer_utils`. A spawned worker (the trainer spawns them, E001) unpickles that and so
imports the trainer's module, which imports peft, which imports bitsandbytes: about 4-5 s of CPU per
worker before its first batch, on every rank (bench/README.md, "A recipe rank's imports"). The worker
needs none of it: it seeds three generators. MeteredTrainer hands the loader this function with the
same arguments instead, so the workers' random streams are the ones transformers would have set.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_loader_worker(worker_id: int, num_workers: int, rank: int) -> None:
    """transformers' `seed_worker`: this worker's torch seed offset by the rank's share, applied as its
    `set_seed` does (torch.manual_seed covers CUDA and the other devices torch knows)."""
    seed = num_workers * rank + torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
