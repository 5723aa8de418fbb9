"""The fixes the trainer applies (G007, P006, E001, X003), each asserted on what it changes, so that
deleting the line that applies it fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flightdeck.recipe import parse_recipe
from flightdeck.worker.train.data import open_training_data
from flightdeck.worker.train.model import load_model, model_factory
from flightdeck.worker.train.recipe_run import build_collator, training_arguments


def test_g007_reentrant_checkpointing_over_frozen_embeddings_still_trains_the_adapters(
    make_recipe: Any, workspace: Path, tmp_path: Path
) -> None:
    """One process asking for reentrant checkpointing keeps it (no G004), so G007 is emitted and the
    trainer's input-grads fix is what gives lora_B a gradient through the checkpointed blocks."""
    from transformers import Trainer, TrainerCallback

    from flightdeck.preflight import run_static_preflight

    submitted = parse_recipe(
        make_recipe(
            model={"gradient_checkpointing": True, "gradient_checkpointing_reentrant": True},
            resources={"gpus_per_node": 1},
            training={"max_steps": 1},
        )
    )
    static = run_static_preflight(submitted)
    assert {f.code for f in static.findings if f.severity == "fix"} >= {"G007"}
    recipe = static.effective
    assert recipe.model.gradient_checkpointing_reentrant is True
    loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
    assert not loaded.model.get_input_embeddings().weight.requires_grad
    grads: dict[str, float | None] = {}

    class AdapterGrads(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            for name, param in loaded.model.named_parameters():
                if "lora_B" in name:  # lora_A's gradient is zero at step 1 (lora_B starts at zero)
                    grads[name] = None if param.grad is None else float(param.grad.norm())

    args = training_arguments(recipe, tmp_path, use_cpu=True, distributed=False)
    dataset = open_training_data(recipe.data.train, workspace, task=recipe.task)
    Trainer(
        model=loaded.model,
        args=args,
        train_dataset=dataset,
        data_collator=build_collator(recipe, loaded),
        callbacks=[AdapterGrads()],
    ).train()
    layers = [m for m in loaded.model.modules() if hasattr(m, "_gradient_checkpointing_func")]
    assert layers and all(m._gradient_checkpointing_func.keywords["use_reentrant"] is True for m in layers)
    assert grads and all(grads.values()), grads


def test_g007_load_model_makes_the_frozen_embeddings_output_require_grad(
    make_recipe: Any, workspace: Path
) -> None:
    """The trainer's own fix, before any Trainer exists (under the Trainer, transformers and peft also
    enable input grads when checkpointing is switched on, so a training run alone cannot tell)."""
    recipe = parse_recipe(make_recipe(model={"gradient_checkpointing": True}))
    loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
    embeddings = loaded.model.get_input_embeddings()
    assert not embeddings.weight.requires_grad
    assert embeddings(torch.tensor([[1, 2, 3]])).requires_grad


def test_p006_a_quantised_model_is_loaded_onto_this_ranks_device(
    make_recipe: Any, workspace: Path, monkeypatch: Any
) -> None:
    seen: dict[str, Any] = {}
    factory = model_factory("causal_lm")
    original = factory.from_pretrained.__func__

    def spy(cls: Any, path: str, **kwargs: Any) -> Any:
        seen.update(kwargs)
        return original(cls, path, **kwargs)

    monkeypatch.setattr(factory, "from_pretrained", classmethod(spy))
    recipe = parse_recipe(make_recipe(model={"quantization": "4bit", "dtype": "bfloat16"}))
    load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=1, use_cpu=True)
    assert seen["device_map"] == {"": "cpu"}  # on a GPU host: {"": local_rank}
    from flightdeck.worker.train.model import _device_map

    assert _device_map(recipe, 1, use_cpu=False) == {"": 1}


def test_e001_loader_workers_are_spawned_not_forked(
    make_recipe: Any, workspace: Path, tmp_path: Path
) -> None:
    from transformers import Trainer

    recipe = parse_recipe(make_recipe(data={"num_workers": 2}))
    loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
    args = training_arguments(recipe, tmp_path, use_cpu=True, distributed=False)
    dataset = open_training_data(recipe.data.train, workspace, task=recipe.task)
    trainer = Trainer(
        model=loaded.model, args=args, train_dataset=dataset, data_collator=build_collator(recipe, loaded)
    )
    loader = trainer.get_train_dataloader()
    context = loader.multiprocessing_context
    assert context is not None and context.get_start_method() == "spawn"
    assert loader.persistent_workers


def test_x003_every_trainable_parameter_is_float32_under_fp16(make_recipe: Any, workspace: Path) -> None:
    recipe = parse_recipe(
        make_recipe(
            model={"dtype": "float16", "gradient_checkpointing": False},
            adapter={"modules_to_save": ["lm_head"]},
            training={"precision": "fp16"},
        )
    )
    loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
    trainable = {n: p.dtype for n, p in loaded.model.named_parameters() if p.requires_grad}
    assert any("modules_to_save" in n for n in trainable)
    assert set(trainable.values()) == {torch.float32}, trainable
    frozen = {p.dtype for p in loaded.model.parameters() if not p.requires_grad}
    assert frozen == {torch.float16}  # the base stays in half precision


def _without_pad(workspace: Path, tmp_path: Path) -> Path:
    import json
    import shutil

    model = tmp_path / "no-pad"
    shutil.copytree(workspace / "models/tiny-llama", model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def test_g009_an_existing_special_token_pads_and_the_vocabulary_is_unchanged(
    make_recipe: Any, workspace: Path, tmp_path: Path
) -> None:
    model = _without_pad(workspace, tmp_path)
    recipe = parse_recipe(make_recipe())
    loaded = load_model(recipe, str(model), local_rank=0, use_cpu=True)
    assert loaded.tokenizer.pad_token == "<unk>" != loaded.tokenizer.eos_token
    assert loaded.model.get_input_embeddings().weight.shape[0] == len(loaded.tokenizer)
    assert [code for code, _ in loaded.fixes] == ["G009"]


def test_g011_a_new_pad_token_under_lora_is_trained_and_saved_with_the_adapter(
    make_recipe: Any, workspace: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    import flightdeck.worker.train.model as model_module

    monkeypatch.setattr(model_module, "reusable_pad_token", lambda tokenizer: None)  # no spare token
    recipe = parse_recipe(make_recipe(model={"gradient_checkpointing": False}))
    loaded = load_model(recipe, str(_without_pad(workspace, tmp_path)), local_rank=0, use_cpu=True)
    assert loaded.tokenizer.pad_token == "<pad>" and [c for c, _ in loaded.fixes] == ["G011"]
    # Without host preflight the recipe did not list them: the record says the trainer added them.
    assert "the recipe did not list embed_tokens, lm_head" in loaded.fixes[0][1]
    with torch.no_grad():  # make the new row recognisable, as training would
        loaded.model.get_input_embeddings().weight[-1].fill_(0.5)
    out = tmp_path / "adapter"
    loaded.model.save_pretrained(out)
    assert {"embed_tokens", "lm_head"} <= set(
        json.loads((out / "adapter_config.json").read_text())["modules_to_save"]
    )
    base = AutoModelForCausalLM.from_pretrained(workspace / "models/tiny-llama")
    base.resize_token_embeddings(len(loaded.tokenizer))
    reloaded = PeftModel.from_pretrained(base, out)
    assert torch.allclose(
        reloaded.get_input_embeddings().weight[-1],
        torch.full_like(base.get_input_embeddings().weight[-1], 0.5),
    )


def test_g004_checkpointing_runs_non_reentrant(make_recipe: Any, workspace: Path, tmp_path: Path) -> None:
    from transformers import Trainer

    recipe = parse_recipe(make_recipe(model={"gradient_checkpointing": True}, training={"max_steps": 1}))
    loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
    args = training_arguments(recipe, tmp_path, use_cpu=True, distributed=False)
    dataset = open_training_data(recipe.data.train, workspace, task=recipe.task)
    Trainer(
        model=loaded.model, args=args, train_dataset=dataset, data_collator=build_collator(recipe, loaded)
    ).train()
    layers = [m for m in loaded.model.modules() if hasattr(m, "_gradient_checkpointing_func")]
    assert layers and all(m._gradient_checkpointing_func.keywords["use_reentrant"] is False for m in layers)


def test_g008_the_kv_cache_is_off_in_training(make_recipe: Any, workspace: Path) -> None:
    for checkpointing in (True, False):
        recipe = parse_recipe(make_recipe(model={"gradient_checkpointing": checkpointing}))
        loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
        assert loaded.model.config.use_cache is False  # the tiny model's config says True
