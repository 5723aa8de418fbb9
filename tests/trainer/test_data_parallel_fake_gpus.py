"""P002 with a real Trainer on a host faked to report 2 GPUs.

The fake is where TrainingArguments reads the GPU count: `_setup_devices` sets `_n_gpu =
torch.cuda.device_count()` when no accelerator is set up (this machine has none, and
`torch.cuda.is_available()` is kept False, so the device stays the CPU and DataParallel over no CUDA
device is a pass-through). The count is faked after the model is loaded, so loading sees the real host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from flightdeck.recipe import parse_recipe
from flightdeck.worker.train.data import open_training_data
from flightdeck.worker.train.health import HealthStop
from flightdeck.worker.train.health_callback import HealthCallback
from flightdeck.worker.train.model import load_model
from flightdeck.worker.train.recipe_run import build_collator, planned_steps_per_epoch, training_arguments


def _fake_two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _trainer(
    recipe_dict: dict[str, Any],
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    hf_device_map: dict[str, Any] | None = None,
) -> tuple[Any, HealthCallback]:
    from transformers import Trainer

    recipe = parse_recipe(recipe_dict)
    loaded = load_model(recipe, str(workspace / recipe.model.path), local_rank=0, use_cpu=True)
    if hf_device_map is not None:
        loaded.model.hf_device_map = hf_device_map  # what accelerate's dispatch leaves on a spread model
    _fake_two_gpus(monkeypatch)
    # use_cpu=False: the devices are resolved as on a GPU host, from the faked count.
    args = training_arguments(recipe, tmp_path / "out", use_cpu=False, distributed=False)
    dataset = open_training_data(recipe.data.train, workspace, task=recipe.task)
    monitor = HealthCallback.for_recipe(
        recipe, planned_steps_per_epoch=planned_steps_per_epoch(len(dataset), recipe, 1), emit=lambda e: None
    )
    trainer = Trainer(
        model=loaded.model, args=args, train_dataset=dataset, data_collator=build_collator(recipe, loaded)
    )
    trainer.add_callback(monitor)
    monitor.trainer = trainer
    return trainer, monitor


def test_fakes_two_gpus_without_device_map_dataparallel_is_fatal_p002(
    make_recipe: Any, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = make_recipe(resources={"gpus_per_node": 1}, training={"max_steps": 2})
    trainer, _ = _trainer(recipe, workspace, tmp_path, monkeypatch)
    assert trainer.args.n_gpu == 2  # the faked host, as the Trainer reads it
    assert trainer._train_batch_size == 2 * trainer.args.per_device_train_batch_size  # the doubled batch
    with pytest.raises(HealthStop) as stopped:
        trainer.train()
    assert stopped.value.event.code == "P002"
    assert isinstance(trainer.model_wrapped, torch.nn.DataParallel)


def test_fakes_two_gpus_with_a_device_map_trains_with_the_planned_steps(
    make_recipe: Any, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The map resolves to one device (no hf_device_map): transformers would keep n_gpu = 2; the
    # trainer's own _n_gpu = 1 (set before the Trainer exists) is what keeps batch and steps as planned.
    recipe = make_recipe(
        model={"device_map": "sequential"}, resources={"gpus_per_node": 2}, training={"max_steps": 2}
    )
    trainer, monitor = _trainer(recipe, workspace, tmp_path, monkeypatch)
    assert getattr(trainer.model, "hf_device_map", None) is None
    assert trainer.args.n_gpu == 1 and trainer._train_batch_size == trainer.args.per_device_train_batch_size
    assert len(trainer.get_train_dataloader()) == monitor.planned_steps_per_epoch
    trainer.train()
    assert trainer.state.global_step == 2
    assert not isinstance(trainer.model_wrapped, torch.nn.DataParallel)


def test_fakes_two_gpus_transformers_itself_unwraps_only_a_map_over_several_gpus(
    make_recipe: Any, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What P002's message says of the installed transformers: a map spanning several GPUs makes the
    Trainer set n_gpu = 1 itself; a 4/8-bit model is never wrapped in DataParallel."""
    recipe = make_recipe(resources={"gpus_per_node": 1}, training={"max_steps": 1})
    spread = {"model.embed_tokens": 0, "model.layers": 0, "model.norm": 1, "lm_head": 1}
    trainer, _ = _trainer(recipe, workspace, tmp_path, monkeypatch, hf_device_map=spread)
    assert trainer.args.n_gpu == 1 and trainer._train_batch_size == trainer.args.per_device_train_batch_size
    trainer, _ = _trainer(recipe, workspace, tmp_path / "q", monkeypatch)
    assert trainer.args.n_gpu == 2
    trainer.model.is_loaded_in_4bit = True
    assert trainer._wrap_model(trainer.model) is trainer.model
