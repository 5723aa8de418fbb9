"""The recipe trainer's loader workers are seeded as transformers seeds them, from worker/train/loader_seed.py."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import numpy as np
import torch

from flightdeck.worker.train.loader_seed import seed_loader_worker


def _streams() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_a_worker_gets_the_seeds_transformers_seed_worker_gives_it() -> None:
    from transformers.trainer_utils import seed_worker

    for base_seed, worker_id, workers, rank in [(1234, 0, 2, 0), (2**40 + 7, 1, 2, 3), (99, 3, 4, 1)]:
        torch.manual_seed(base_seed)  # what the DataLoader sets in each worker before worker_init_fn
        seed_worker(worker_id, num_workers=workers, rank=rank)
        theirs = _streams()
        torch.manual_seed(base_seed)
        seed_loader_worker(worker_id, num_workers=workers, rank=rank)
        assert _streams() == theirs


def test_the_metered_trainers_loader_seeds_its_workers_from_the_light_module(
    workspace: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, TrainingArguments

    from flightdeck.worker.train.metered_trainer import MeteredTrainer

    model = AutoModelForCausalLM.from_pretrained(workspace / "models/tiny-llama")
    rows = [{"input_ids": torch.tensor([1, 2, 3]), "labels": torch.tensor([1, 2, 3])}] * 8
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to="none",
        dataloader_num_workers=2,
        dataloader_multiprocessing_context="spawn",
        dataloader_persistent_workers=True,
        remove_unused_columns=False,
    )
    loader = MeteredTrainer(model=model, args=args, train_dataset=rows).get_train_dataloader()
    # accelerate's shard reads its attributes from the DataLoader it iterates; that one must hold it.
    for holder in (loader, getattr(loader, "base_dataloader", loader)):
        given = holder.worker_init_fn
        assert isinstance(given, functools.partial) and given.func is seed_loader_worker
        assert given.keywords == {"num_workers": 2, "rank": 0}
