"""The training sampler keeps its permutation as a tensor, the same on every rank (bench/README.md, data)."""

from __future__ import annotations

import tracemalloc

from torch.utils.data import RandomSampler

from flightdeck.worker.train.metered_trainer import MeteredTrainer
from flightdeck.worker.train.shuffled_indices import ShuffledIndices


def test_each_epoch_is_a_permutation_the_same_for_every_rank() -> None:
    data = range(1000)
    rank0, rank1 = ShuffledIndices(data, seed=7), ShuffledIndices(data, seed=7)
    first = list(rank0)
    assert sorted(first) == list(range(1000)) and first != list(range(1000))
    assert list(rank1) == first  # accelerate's batch shards split this one order between the ranks
    rank0.set_epoch(1)
    assert list(rank0) != first and sorted(rank0) == list(range(1000))


def test_a_large_dataset_holds_no_python_list_of_its_indices() -> None:
    """torch's RandomSampler makes `randperm(n).tolist()`: ~36 bytes an index in every rank."""
    data = range(250_000)
    tracemalloc.start()
    try:
        iterator = iter(ShuffledIndices(data, seed=0))
        next(iterator)
        ours = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        next(iter(RandomSampler(data)))
        torch_list = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert torch_list > 7 * 2**20  # the list it replaces: ~36 bytes an index
    assert ours < 3.5 * 2**20  # one chunk of Python ints


def test_the_trainer_shuffles_with_it() -> None:
    class Args:
        train_sampling_strategy, data_seed, seed = "random", None, 3
        group_by_length = False

    trainer = MeteredTrainer.__new__(MeteredTrainer)
    trainer.args, trainer.train_dataset = Args(), list(range(10))
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, ShuffledIndices) and sampler.seed == 3
