"""The HF Trainer, counting the tokens and samples each optimizer step consumed (for tokens/s),
shuffling with a sampler that holds its permutation as a tensor (worker/train/shuffled_indices.py), and
seeding its loader workers from a light module (worker/train/loader_seed.py)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_utils import seed_worker

from flightdeck.worker.train.loader_seed import seed_loader_worker
from flightdeck.worker.train.shuffled_indices import ShuffledIndices


class MeteredTrainer(Trainer):
    """Trainer that sums non-padding tokens and rows per step on-device, without a host sync."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.metered_tokens = torch.zeros((), dtype=torch.long, device=self.args.device)
        self.metered_samples = 0

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        """The Trainer's own choice, except that its RandomSampler (a Python list of every index in every
        rank) becomes ShuffledIndices: same seed on every rank, a tensor instead of the list."""
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler) is torch.utils.data.RandomSampler:
            data = train_dataset if train_dataset is not None else self.train_dataset
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            return ShuffledIndices(data, seed=seed)
        return sampler

    def get_train_dataloader(self) -> Any:
        """The Trainer's loader, its workers seeded by `seed_loader_worker` instead of transformers'
        `seed_worker` (same seeds; a spawned worker then never imports transformers' trainer module).
        Set before the first iteration, which starts the workers; accelerate's copies of the loader (a
        resume's skip_first_batches) take the attribute over."""
        loader = super().get_train_dataloader()
        # accelerate's DataLoaderShard iterates the torch DataLoader it wraps (and reads attributes from it).
        iterated = getattr(loader, "base_dataloader", loader)
        given = getattr(iterated, "worker_init_fn", None)
        if isinstance(given, functools.partial) and given.func is seed_worker:
            iterated.worker_init_fn = functools.partial(seed_loader_worker, *given.args, **given.keywords)
        return loader

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> torch.Tensor:
        self.meter(inputs)
        return super().training_step(model, inputs, *args, **kwargs)

    def meter(self, inputs: dict[str, Any]) -> None:
        """Count one micro-batch's non-padding tokens and rows."""
        mask = inputs.get("attention_mask")
        if mask is not None:
            self.metered_tokens += mask.sum()
        self.metered_samples += len(inputs["input_ids"])

    def take_meter(self) -> tuple[int, int]:
        """(tokens, samples) on this rank since the last call."""
        tokens, samples = int(self.metered_tokens), self.metered_samples
        self.metered_tokens.zero_()
        self.metered_samples = 0
        return tokens, samples
