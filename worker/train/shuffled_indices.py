"""The training sampler: a seeded permutation of the dataset's indices, kept as one int64 tensor.

Why not torch's RandomSampler: its `__iter__` is `yield from torch.randperm(n).tolist()`, a Python list
of n ints (about 36 bytes an index) held in every rank for the whole epoch. For R3's 14.7M-line corpus
that is ~530 MB per rank, more than the memory-mapped Arrow data the ranks share (bench/README.md,
"Data loading"). Here the permutation stays a tensor (8 bytes an index) and is handed out in chunks.

Every rank builds the same permutation (the recipe's seed + the epoch), so accelerate's per-rank batch
shards (BatchSamplerShard) split one order between the ranks, as they do for the seeded RandomSampler.
It is no RandomSampler subclass, or accelerate would swap it for its own SeedableRandomSampler.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler

# Indices turned into Python ints at a time: a few hundred KB, whatever the corpus.
CHUNK = 65_536


class ShuffledIndices(Sampler[int]):
    """A new permutation of range(len(data)) each epoch, the same on every rank."""

    def __init__(self, data: Sized, *, seed: int):
        self.size = len(data)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator)
        for start in range(0, self.size, CHUNK):
            yield from order[start : start + CHUNK].tolist()
