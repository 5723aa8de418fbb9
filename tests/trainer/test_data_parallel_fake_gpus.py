"""P002 with a real Trainer on a host faked to report 2 GPUs (this machine has none: `_n_gpu` is set to
what TrainingArguments computes on a 2-GPU host; DataParallel over no CUDA device is a pass-through)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.recipe import parse_recipe
from worker.train.data import open_training_data
from worker.train.health import HealthMonitor, HealthStop
from worker.train.model import load_model
from worker.train.recipe_run import build_collator, planned_steps_per_epoch, training_arguments


def _trainer(recipe_dict: dict[str, Any], workspace: Path, tmp_path: Path) -> tuple[Any, HealthMonitor]:
    from transformers import Trainer

    recipe = parse_recipe(recipe_dict)
    args = training_arguments(recipe, tmp_path / "out", use_cpu=True, distributed=False)
    if recipe.model.device_map is None:
        _ = args.n_gpu
    if args._n_gpu != 1:
        args._n_gpu = 2  # what _setup_devices computes on a host with 2 visible GPUs
    loaded = load_model(recipe, str(workspace / recipe.model.path), local_rank=0, use_cpu=True)
    dataset = open_training_data(recipe.data.train, workspace, task=recipe.task)
    monitor = HealthMonitor.for_recipe(
        recipe, planned_steps_per_epoch=planned_steps_per_epoch(len(dataset), recipe, 1), emit=lambda e: None
    )
    trainer = Trainer(
        model=loaded.model, args=args, train_dataset=dataset, data_collator=build_collator(recipe, loaded)
    )
    trainer.add_callback(monitor)
    monitor.trainer = trainer
    return trainer, monitor


def test_fakes_two_gpus_without_device_map_dataparallel_is_fatal_p002(
    make_recipe: Any, workspace: Path, tmp_path: Path
) -> None:
    trainer, _ = _trainer(make_recipe(training={"max_steps": 2}), workspace, tmp_path)
    assert trainer._train_batch_size == 2 * trainer.args.per_device_train_batch_size  # the doubled batch
    with pytest.raises(HealthStop) as stopped:
        trainer.train()
    assert stopped.value.event.code == "P002"


def test_fakes_two_gpus_with_a_device_map_trains_with_the_planned_steps(
    make_recipe: Any, workspace: Path, tmp_path: Path
) -> None:
    recipe = make_recipe(
        model={"device_map": "balanced"}, resources={"gpus_per_node": 1}, training={"max_steps": 2}
    )
    trainer, monitor = _trainer(recipe, workspace, tmp_path)
    assert trainer.args.n_gpu == 1 and trainer._train_batch_size == trainer.args.per_device_train_batch_size
    steps = len(trainer.get_train_dataloader())
    assert steps == monitor.planned_steps_per_epoch
    trainer.train()
    assert trainer.state.global_step == 2
