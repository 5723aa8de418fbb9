"""G002 per adapted module: R1's mechanism, a vision tower frozen by the model's own code after the
adapters exist, while the language model's adapters keep learning (the total adapter norm stays > 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from flightdeck.recipe import parse_recipe
from flightdeck.worker.train.data import open_training_data
from flightdeck.worker.train.health import HealthEvent, HealthStop
from flightdeck.worker.train.health_callback import HealthCallback
from flightdeck.worker.train.model import load_model
from flightdeck.worker.train.recipe_run import build_collator, planned_steps_per_epoch, training_arguments

from .test_vision_language import LLAVA, vl_recipe


class LazilyLoadedTower(torch.nn.Module):
    """What R1's model code did: the tower 'loads' on first use and freezes itself (requires_grad_(False)),
    long after get_peft_model attached adapters to its q_proj/v_proj."""

    def __init__(self, tower: torch.nn.Module):
        super().__init__()
        self.tower = tower
        self.loaded = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.loaded:
            self.tower.requires_grad_(False)
            self.loaded = True
        return self.tower(*args, **kwargs)


class NoGradTower(torch.nn.Module):
    """A model whose own forward runs the tower under torch.no_grad(): its adapters stay trainable
    (requires_grad True) but never receive a gradient."""

    def __init__(self, tower: torch.nn.Module):
        super().__init__()
        self.tower = tower

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return self.tower(*args, **kwargs)


def _train(
    workspace: Path, tmp_path: Path, lazy_tower: bool, wrap: type[torch.nn.Module] = LazilyLoadedTower
) -> tuple[list[HealthEvent], Any]:
    from transformers import Trainer

    recipe = parse_recipe(
        vl_recipe(
            LLAVA,
            model={"freeze": [], "gradient_checkpointing": False},
            adapter={"target_modules": ["q_proj", "v_proj"]},  # in the SigLIP tower and the language model
            training={"max_steps": 5, "learning_rate": 0.01, "warmup_ratio": 0.0, "precision": "fp32"},
        )
    )
    loaded = load_model(recipe, str(workspace / LLAVA), local_rank=0, use_cpu=True)
    inner = loaded.model.base_model.model.model
    if lazy_tower:
        inner.vision_tower = wrap(inner.vision_tower)
    dataset = open_training_data(recipe.data.train, workspace, task=recipe.task)
    events: list[HealthEvent] = []
    monitor = HealthCallback.for_recipe(
        recipe, planned_steps_per_epoch=planned_steps_per_epoch(len(dataset), recipe, 1), emit=events.append
    )
    args = training_arguments(recipe, tmp_path / "out", use_cpu=True, distributed=False)
    trainer = Trainer(
        model=loaded.model, args=args, train_dataset=dataset, data_collator=build_collator(recipe, loaded)
    )
    trainer.add_callback(monitor)
    monitor.trainer = trainer
    trainer.train()
    return events, monitor


def test_a_tower_frozen_by_the_models_own_code_stops_the_run_naming_its_adapters(
    workspace: Path, tmp_path: Path
) -> None:
    with pytest.raises(HealthStop) as stopped:
        _train(workspace, tmp_path, lazy_tower=True)
    event = stopped.value.event
    assert event.code == "G002" and event.step == 3  # judged from step 2; zero_grad_patience 2: step 3
    frozen = event.data["frozen_adapter_tensors"]
    assert frozen and all(".vision_tower." in name and "lora_" in name for name in frozen)
    assert "language_model" in event.message or "others learn" in event.message


def test_the_same_model_without_the_lazy_freeze_trains(workspace: Path, tmp_path: Path) -> None:
    events, monitor = _train(workspace, tmp_path, lazy_tower=False)
    assert not [e for e in events if e.code == "G002"]
    assert monitor.adapter_grad_norm(None)


def test_a_tower_run_under_no_grad_stops_the_run_naming_its_trainable_adapters(
    workspace: Path, tmp_path: Path
) -> None:
    with pytest.raises(HealthStop) as stopped:
        _train(workspace, tmp_path, lazy_tower=True, wrap=NoGradTower)
    event = stopped.value.event
    assert (event.code, event.severity, event.step) == ("G002", "fatal", 3)
    dead = event.data["dead_adapter_tensors"]
    assert dead and all(".vision_tower." in name and "lora_" in name for name in dead)
    assert event.data["frozen_adapter_tensors"] == []  # trainable, yet cut off from the loss
    assert "no_grad" in event.message and "target_modules" in (event.fix or "")
