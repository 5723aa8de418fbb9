"""Vision-language training pieces on the tiny Qwen2-VL and LLaVA-SigLIP models (R1, R2; V001-V006)."""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from flightdeck.inventory import WorkerInventory
from flightdeck.preflight import run_static_preflight
from flightdeck.preflight.vision_rules import image_columns_removed
from flightdeck.recipe import parse_recipe
from flightdeck.recipe.model_parts import peft_target_modules, resolve_freeze
from flightdeck.recipe.schema import DataSource
from flightdeck.worker.host_preflight import run_host_preflight
from flightdeck.worker.train.collate import VisionLanguageCollator
from flightdeck.worker.train.data import DataSourceError, iter_samples, open_training_data
from flightdeck.worker.train.health import HealthStop
from flightdeck.worker.train.image_text import IGNORE_INDEX, ImageTextProcessor, view_mismatch
from flightdeck.worker.train.model import load_model, quantised_modules
from flightdeck.worker.train.model_output import attach_tolerant_loss

QWEN, LLAVA = "models/tiny-qwen2-vl", "models/tiny-llava-siglip"
VL_DATA = [
    {"path": "data/chartqa-vl", "split": "train", "preset": "chartqa"},
    {"path": "data/infovqa-vl.jsonl", "preset": "infovqa"},
    {"path": "data/ocrvqa-vl.parquet", "preset": "ocrvqa"},
]


def vl_recipe(model_path: str = QWEN, **overrides: Any) -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "name": "vl-test",
        "task": "vision_language",
        "model": {"path": model_path, "dtype": "float32", "freeze": ["vision_tower"]},
        "adapter": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["language_model.q_proj"]},
        "data": {"train": VL_DATA, "max_seq_length": 96, "num_workers": 0},
        "training": {"per_device_batch_size": 2, "gradient_accumulation_steps": 1, "max_steps": 2},
        "resources": {"gpus_per_node": 1, "accelerator": "any"},
    }
    for key, value in overrides.items():
        recipe[key] = {**recipe.get(key, {}), **value} if isinstance(value, dict) else value
    return recipe


def host_findings(recipe: dict[str, Any], workspace: Path, devices: int = 1) -> Any:
    static = run_static_preflight(parse_recipe(recipe))
    inventory = WorkerInventory(cpu_slots=2, cores=2, workspace=str(workspace), runs_dir=str(workspace / "r"))
    return run_host_preflight(static.effective, inventory, workspace, list(range(devices)))


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "gray").save(buffer, format="PNG")
    return buffer.getvalue()


# --- data: the three shapes image sets come in ----------------------------------------------------


def test_presets_read_images_as_struct_path_and_raw_bytes(workspace: Path) -> None:
    chart, info, ocr = (
        list(iter_samples(DataSource(**source), workspace, task="vision_language", limit=4))
        for source in VL_DATA
    )
    # Every shape becomes the `Image` feature's {bytes, path} struct, decoded later in the collator.
    assert chart[0]["images"][0]["bytes"][:4] == b"\x89PNG"
    assert info[0]["images"][0]["bytes"] is None
    assert Path(info[0]["images"][0]["path"]).is_file()  # relative to the dataset file, made absolute
    assert ocr[0]["images"][0]["bytes"][:4] == b"\x89PNG" and ocr[0]["images"][0]["path"] is None
    assert info[0]["question"].startswith("What is") and info[0]["answer"].isdigit()  # question/answers
    assert ocr[0]["images"] == ocr[1]["images"]  # several questions of one image: flattened (D002)


def test_a_struct_image_with_only_a_path_is_read_from_beside_the_dataset(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flightdeck.worker.train.image_text import load_image

    # An HF export whose images stayed files: {bytes: null, path}, the path relative to the parquet file.
    (tmp_path / "sets" / "images").mkdir(parents=True)
    (tmp_path / "sets" / "images" / "c0.png").write_bytes(_png(40, 30))
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image), ("query", pa.string()), ("label", pa.list_(pa.string()))])
    row = {"image": {"bytes": None, "path": "images/c0.png"}, "query": "Which value?", "label": ["7"]}
    pq.write_table(pa.Table.from_pylist([row], schema=schema), tmp_path / "sets" / "chart.parquet")
    source = DataSource(path="sets/chart.parquet", preset="chartqa")
    (sample,) = iter_samples(source, tmp_path, task="vision_language")
    assert sample["images"] == [{"bytes": None, "path": str(tmp_path / "sets" / "images" / "c0.png")}]
    assert (sample["question"], sample["answer"]) == ("Which value?", "7")
    assert load_image(sample["images"][0]).size == (40, 30)


def test_text_tasks_ignore_the_image_column(workspace: Path) -> None:
    sample = next(iter_samples(DataSource(**VL_DATA[0]), workspace, task="causal_lm"))
    assert {"question", "answer"} <= set(sample) and "images" not in sample


# --- processor: answer-only labels, per-image token counts, V001 ------------------------------------


def test_only_the_answer_is_supervised_and_image_tokens_follow_the_image_size(workspace: Path) -> None:
    processor = ImageTextProcessor.from_pretrained(workspace / QWEN)
    square = processor.encode({"question": "q?", "answer": "42", "images": [_png(56, 56)]}, 512)
    wide = processor.encode({"question": "q?", "answer": "42", "images": [_png(112, 56)]}, 512)
    tokens = [sum(1 for t in e.input_ids if t == processor.image_token_id) for e in (square, wide)]
    grid = [int(e.image_inputs["image_grid_thw"][0].prod()) // 4 for e in (square, wide)]
    assert tokens == grid and tokens[0] != tokens[1]  # computed per image, never assumed
    supervised = [
        t for t, label in zip(square.input_ids, square.labels, strict=True) if label != IGNORE_INDEX
    ]
    assert processor.tokenizer.decode(supervised).startswith("42")
    assert all(
        label == IGNORE_INDEX
        for t, label in zip(square.input_ids, square.labels, strict=True)
        if t == processor.image_token_id
    )


def test_v001_a_prompt_whose_image_tokens_do_not_fit_is_refused_not_truncated(workspace: Path) -> None:
    processor = ImageTextProcessor.from_pretrained(workspace / QWEN)
    with pytest.raises(DataSourceError) as raised:
        processor.encode({"question": "q?", "answer": "1", "images": [_png(56, 56)]}, 12)
    assert raised.value.code == "V001" and "max_seq_length" in raised.value.message


def test_v001_host_preflight_runs_the_real_processor_on_sample_rows(workspace: Path) -> None:
    findings = host_findings(vl_recipe(data={"max_seq_length": 12}), workspace).findings
    v001 = [f for f in findings if f.code == "V001"]
    assert v001 and v001[0].severity == "error" and v001[0].path == "data.max_seq_length"
    assert "image tokens" in v001[0].message
    assert not [f for f in host_findings(vl_recipe(), workspace).findings if f.severity == "error"]


@pytest.mark.slow
def test_v001_raised_in_a_loader_worker_process_reaches_the_main_process_with_its_code(
    workspace: Path,
) -> None:
    from torch.utils.data import DataLoader

    processor = ImageTextProcessor.from_pretrained(workspace / QWEN)
    collator = VisionLanguageCollator(processor, max_seq_length=12)
    rows = [{"question": "q?", "answer": "1", "images": [_png(56, 56)]}]
    # As the trainer loads (recipe_run.training_arguments): spawned workers, the collator in the worker.
    loader = DataLoader(
        rows, batch_size=1, num_workers=1, multiprocessing_context="spawn", collate_fn=collator
    )
    with pytest.raises(DataSourceError) as raised:
        next(iter(loader))
    assert raised.value.code == "V001" and raised.value.message.startswith("a sample needs")
    assert "max_seq_length" in raised.value.message and "Traceback" not in raised.value.message
    # The fix crosses from the worker process in the text and comes back apart (the failure's fix field).
    assert raised.value.fix and raised.value.fix.startswith("raise data.max_seq_length above")
    assert (
        str(raised.value) == f"V001: {raised.value.message}\nfix: {raised.value.fix}"
    )  # as the log shows it
    copy = pickle.loads(pickle.dumps(DataSourceError("D001", "no field", available_fields=["query"])))
    assert (copy.code, copy.message, copy.available_fields) == ("D001", "no field", ["query"])


# --- V002: views the tower was not built for ------------------------------------------------------


@pytest.mark.slow
def test_v002_processor_settings_that_do_not_match_the_tower(workspace: Path) -> None:
    from transformers import AutoConfig, AutoImageProcessor

    for model, setting in ((QWEN, {"patch_size": 16}), (LLAVA, {"size": {"height": 64, "width": 64}})):
        config = AutoConfig.from_pretrained(workspace / model).to_dict()
        good = AutoImageProcessor.from_pretrained(workspace / model)
        bad = AutoImageProcessor.from_pretrained(workspace / model, **setting)
        assert view_mismatch(config, good) is None
        assert "vision_config" in (view_mismatch(config, bad) or "")


def test_v002_host_preflight_refuses_a_checkpoint_whose_processor_does_not_match_its_tower(
    workspace: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    # The model as a user might get it: its preprocessor_config.json edited (or copied from a sibling).
    model = tmp_path / "models" / "vl"
    shutil.copytree(workspace / QWEN, model)
    settings = json.loads((model / "preprocessor_config.json").read_text())
    (model / "preprocessor_config.json").write_text(json.dumps({**settings, "patch_size": 16}))
    shutil.copytree(workspace / "data", tmp_path / "data")
    v002 = [f for f in host_findings(vl_recipe(str(model)), tmp_path).findings if f.code == "V002"]
    assert [(f.severity, f.path, f.where) for f in v002] == [("error", "model.path", "host")]
    assert "vision_config.patch_size is 14" in v002[0].message
    assert "Set patch_size=14 in preprocessor_config.json" in v002[0].message  # the fix


# --- freezing by part and LoRA within a part ------------------------------------------------------


def test_parts_resolve_per_architecture_and_lora_lands_only_in_the_language_model(workspace: Path) -> None:
    assert resolve_freeze(["vision_tower", "^lm_head"], "qwen2_vl") == [
        r"^model\.visual\.(?!merger\.)",
        "^lm_head",
    ]
    recipe = parse_recipe(
        vl_recipe(LLAVA, adapter={"target_modules": ["language_model.q_proj", "language_model.v_proj"]})
    )
    loaded = load_model(recipe, str(workspace / LLAVA), local_rank=0, use_cpu=True)
    lora = [n for n, _ in loaded.model.named_parameters() if "lora_" in n]
    assert lora and all(".language_model." in n for n in lora)  # SigLIP has q_proj/v_proj too
    tower = [p for n, p in loaded.model.named_parameters() if ".vision_tower." in n]
    assert tower and not any(p.requires_grad for p in tower)
    assert peft_target_modules(["q_proj"], "llava") == ["q_proj"]  # plain names reach PEFT as they are
    # A part-qualified name becomes one regex that PEFT full-matches: the language model's q_proj only.
    pattern = peft_target_modules(["language_model.q_proj"], "llava")
    assert isinstance(pattern, str)
    # PEFT matches the names of the model it wraps (the PeftModel's own start with base_model.model.).
    names = [n.removeprefix("base_model.model.") for n, _ in loaded.model.named_modules()]
    q_projs = [n for n in names if n.endswith(".q_proj")]
    matched = [n for n in q_projs if re.fullmatch(pattern, n)]
    assert matched and all(".language_model." in n for n in matched)
    assert any(".vision_tower." in n for n in q_projs)  # the tower's own q_proj was there to refuse


def test_a_text_task_on_a_vision_checkpoint_names_task(workspace: Path) -> None:
    findings = host_findings(vl_recipe(task="causal_lm", data={"train": [VL_DATA[0]]}), workspace).findings
    assert [(f.path, f.severity) for f in findings if f.path == "task"] == [("task", "error")]
    text = vl_recipe("models/tiny-llama", model={"freeze": []}, adapter={"target_modules": ["q_proj"]})
    assert [f.path for f in host_findings(text, workspace).findings if f.severity == "error"] == ["task"]


# --- V003: trainable tower under DDP with text-only rows -----------------------------------------


def test_v003_text_rows_with_a_trainable_tower_under_ddp_get_a_blank_image(
    workspace: Path, tmp_path: Path
) -> None:
    text_rows = tmp_path / "text.jsonl"
    text_rows.write_text('{"query": "How are you?", "label": "fine"}\n' * 8)
    recipe = vl_recipe(
        model={"freeze": []},
        adapter={"target_modules": ["qkv", "q_proj", "v_proj"]},  # LoRA in the tower (qkv) too
        data={"train": [VL_DATA[0], {"path": str(text_rows), "preset": "chartqa"}]},
        resources={"gpus_per_node": 2},
    )
    host = host_findings(recipe, workspace, devices=2)
    v003 = [f for f in host.findings if f.code == "V003"]
    assert v003 and v003[0].severity == "fix" and host.effective.data.blank_image_for_text_rows
    frozen = vl_recipe(data={"train": recipe["data"]["train"]}, resources={"gpus_per_node": 2})
    assert "V003" not in {f.code for f in host_findings(frozen, workspace, devices=2).findings}

    processor = ImageTextProcessor.from_pretrained(workspace / QWEN)
    sample = {"question": "How are you?", "answer": "fine", "images": []}
    fixed = VisionLanguageCollator(processor, max_seq_length=96, blank_image_for_text_rows=True)([sample])
    plain = VisionLanguageCollator(processor, max_seq_length=96)([sample])
    assert "pixel_values" in fixed and "pixel_values" not in plain


def test_v003_a_trainable_projector_alone_counts_like_the_tower(workspace: Path, tmp_path: Path) -> None:
    text_rows = tmp_path / "text.jsonl"
    text_rows.write_text('{"query": "How are you?", "label": "fine"}\n' * 8)
    train = [VL_DATA[0], {"path": str(text_rows), "preset": "chartqa"}]
    # Qwen2-VL: tower and language model frozen, the merger (the projector, a part of its own) trains.
    merger_only = vl_recipe(
        adapter=None,
        model={"freeze": ["vision_tower", "language_model"]},
        data={"train": train},
        resources={"gpus_per_node": 2},
    )
    host = host_findings(merger_only, workspace, devices=2)
    assert [f.severity for f in host.findings if f.code == "V003"] == ["fix"]
    assert host.effective.data.blank_image_for_text_rows
    # LLaVA: LoRA on the language model, the projector saved (trained) in full with the adapter.
    saved = vl_recipe(
        LLAVA,
        adapter={"modules_to_save": ["multi_modal_projector"]},
        data={"train": train},
        resources={"gpus_per_node": 2},
    )
    assert "V003" in {f.code for f in host_findings(saved, workspace, devices=2).findings}
    # Both parts frozen, the language model trained in full: every rank trains the same parameters.
    image_path_frozen = {
        **merger_only,
        "model": {**merger_only["model"], "freeze": ["vision_tower", "projector"]},
    }
    assert "V003" not in {f.code for f in host_findings(image_path_frozen, workspace, devices=2).findings}

    # The fix reaches the projector: a text-only row with its blank image gives the merger gradients.
    loaded = load_model(host.effective, str(workspace / QWEN), local_rank=0, use_cpu=True)
    processor = ImageTextProcessor.from_pretrained(workspace / QWEN)
    collator = VisionLanguageCollator(processor, max_seq_length=96, blank_image_for_text_rows=True)
    loaded.model(**collator([{"question": "How are you?", "answer": "fine", "images": []}])).loss.backward()
    merger = {n: p.grad for n, p in loaded.model.named_parameters() if ".visual.merger." in n}
    assert merger and all(g is not None for g in merger.values())


# --- V004: the Trainer's column removal ------------------------------------------------------------


def test_v004_column_removal_is_turned_off_and_the_real_trainer_then_keeps_the_image(workspace: Path) -> None:
    from transformers import Trainer

    from flightdeck.worker.train.recipe_run import build_collator, training_arguments

    asked = parse_recipe(vl_recipe(training={"remove_unused_columns": True}))
    assert [o.finding.code for o in image_columns_removed(asked, None)] == ["V004"]
    effective = run_static_preflight(asked).effective
    assert effective.training.remove_unused_columns is False
    loaded = load_model(effective, str(workspace / QWEN), local_rank=0, use_cpu=True)
    dataset = open_training_data(effective.data.train, workspace, task="vision_language")

    def first_batch(recipe: Any, tmp: str) -> dict[str, Any]:
        args = training_arguments(recipe, Path(tmp), use_cpu=True, distributed=False)
        trainer = Trainer(
            model=loaded.model, args=args, train_dataset=dataset, data_collator=build_collator(recipe, loaded)
        )
        return next(iter(trainer.get_train_dataloader()))

    assert "pixel_values" in first_batch(effective, str(workspace / "out-v004"))
    with pytest.raises(DataSourceError, match="arrived empty"):  # every sample key was dropped
        first_batch(asked, str(workspace / "out-v004b"))


# --- V005: stage 2 quantises what stage 1 trained ---------------------------------------------------


def test_v005_static_fix_keeps_the_trained_tower_out_of_4bit() -> None:
    recipe = parse_recipe(
        vl_recipe(
            adapter=None,
            model={"freeze": ["language_model"]},
            stages=[
                {},
                {
                    "model": {"path": "@previous", "quantization": "4bit"},
                    "adapter": {"target_modules": ["language_model.q_proj"]},
                },
            ],
        )
    )
    result = run_static_preflight(recipe)
    assert [f.path for f in result.findings if f.code == "V005"] == [
        "stages[1].model.quantization_skip_modules"
    ]
    assert result.effective.stages is not None
    assert result.effective.stages[1]["model"]["quantization_skip_modules"] == ["vision_tower"]
    parse_recipe(result.effective.model_dump(mode="json"))  # the trainer accepts what preflight made


def test_v005_a_short_skip_name_quantises_the_tower_and_the_trainer_stops(workspace: Path) -> None:
    short = parse_recipe(
        vl_recipe(
            model={"quantization": "4bit", "quantization_skip_modules": ["visual"], "dtype": "bfloat16"}
        )
    )
    with pytest.raises(HealthStop) as stopped:
        load_model(short, str(workspace / QWEN), local_rank=0, use_cpu=True)
    assert stopped.value.event.code == "V005" and stopped.value.event.data["modules"]
    host = host_findings(short.model_dump(mode="json"), workspace)
    assert host.effective.model.quantization_skip_modules == ["vision_tower"]
    loaded = load_model(host.effective, str(workspace / QWEN), local_rank=0, use_cpu=True)
    assert quantised_modules(loaded.model, ("model.visual", "base_model.model.model.visual")) == []
    assert quantised_modules(loaded.model, ("base_model.model.model.language_model",))  # the LM is 4-bit


# --- V006: a model output that is not a standard one ------------------------------------------------


@dataclass
class _CustomOutput:
    """Like R1's model output: extra fields, not a transformers ModelOutput, no indexing."""

    loss: torch.Tensor
    logits: torch.Tensor
    new_input_ids: torch.Tensor


class _CustomModel(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, **inputs: Any) -> _CustomOutput:
        out = self.inner(**inputs)
        return _CustomOutput(out.loss, out.logits, inputs["input_ids"])


def test_v006_a_custom_output_type_is_turned_into_a_loss(workspace: Path) -> None:
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    base = AutoModelForCausalLM.from_pretrained(workspace / "models/tiny-llama")
    ids = torch.tensor([[1, 5, 6, 7]])
    batch = {"input_ids": ids, "labels": ids}
    args = TrainingArguments(str(workspace / "out-v006"), use_cpu=True, report_to="none")
    trainer = Trainer(model=_CustomModel(base), args=args)
    with pytest.raises(TypeError):
        trainer.compute_loss(trainer.model, dict(batch))
    notes: list[str] = []
    attach_tolerant_loss(trainer.model, notes.append)
    loss = trainer.compute_loss(trainer.model, dict(batch))
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert len(notes) == 1 and "_CustomOutput" in notes[0]
    trainer.compute_loss(trainer.model, dict(batch))
    assert len(notes) == 1  # said once
    assert re.search("loss", notes[0])


# --- memory: the tower counts, and what trains in it -------------------------------------------------


def test_the_estimate_counts_the_tower_and_trains_only_what_the_stage_trains(workspace: Path) -> None:
    import json

    from flightdeck.memory import estimate_memory, model_shape

    config = json.loads((workspace / QWEN / "config.json").read_text())
    shape = model_shape(config)
    assert shape is not None and shape.extra_parameters > 0
    stage1 = estimate_memory(
        parse_recipe(vl_recipe(adapter=None, model={"freeze": ["language_model"]})), shape
    )
    full = estimate_memory(parse_recipe(vl_recipe(adapter=None, model={"freeze": []})), shape)
    lora = estimate_memory(parse_recipe(vl_recipe()), shape)
    assert stage1.trainable_parameters == shape.extra_parameters
    assert full.trainable_parameters == shape.total_parameters
    assert 0 < lora.trainable_parameters < stage1.trainable_parameters


def test_a_checkpoint_keeping_its_chat_template_beside_the_processor_works_and_none_is_an_error(
    workspace: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    model = tmp_path / "models" / "vl"
    shutil.copytree(workspace / QWEN, model)
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copytree(workspace / "data", tmp_path / "data")
    errors = [
        f.path for f in host_findings(vl_recipe(str(model)), tmp_path).findings if f.severity == "error"
    ]
    assert errors == ["model.path"]
    (model / "chat_template.json").write_text(
        json.dumps({"chat_template": template})
    )  # as HF processors save it
    assert not [f for f in host_findings(vl_recipe(str(model)), tmp_path).findings if f.severity == "error"]
    assert ImageTextProcessor.from_pretrained(model).tokenizer.chat_template == template


def test_v006_the_trainer_loads_models_with_the_tolerant_loss_hook(make_recipe: Any, workspace: Path) -> None:
    from transformers import Trainer, TrainingArguments

    recipe = parse_recipe(make_recipe(model={"gradient_checkpointing": False}))
    loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
    inner = loaded.model.base_model.model
    standard_forward = inner.forward
    inner.forward = lambda **kw: _CustomOutput(
        *(lambda o: (o.loss, o.logits))(standard_forward(**kw)), kw["input_ids"]
    )
    notes: list[str] = []
    assert loaded.tolerant_loss is not None
    loaded.tolerant_loss.note = notes.append
    ids = torch.tensor([[1, 5, 6, 7]])
    trainer = Trainer(
        model=loaded.model,
        args=TrainingArguments(str(workspace / "out-v006b"), use_cpu=True, report_to="none"),
    )
    assert trainer.compute_loss(trainer.model, {"input_ids": ids, "labels": ids}).dim() == 0
    assert notes and "_CustomOutput" in notes[0]


def test_the_effective_recipe_shows_the_concrete_prefixes_of_a_named_part(workspace: Path) -> None:
    host = host_findings(vl_recipe(LLAVA, model={"freeze": ["vision_tower", "projector"]}), workspace)
    assert host.effective.model.freeze == [r"^model\.vision_tower\.", r"^model\.multi_modal_projector\."]
    (resolution,) = [f for f in host.findings if f.path == "model.freeze"]
    assert resolution.severity == "fix" and resolution.code is None
    loaded = load_model(host.effective, str(workspace / LLAVA), local_rank=0, use_cpu=True)
    frozen = {n for n, p in loaded.model.named_parameters() if not p.requires_grad}
    assert any(".multi_modal_projector." in n for n in frozen)


def test_the_agent_reports_the_resolved_prefixes_to_the_service_as_a_preflight_event(workspace: Path) -> None:
    from flightdeck.worker.agent.host_check import run_host_check

    # What the agent runs before launch, on the recipe the claim hands it (the static effective one).
    submitted = vl_recipe(LLAVA, model={"freeze": ["vision_tower", "projector"]})
    effective = run_static_preflight(parse_recipe(submitted)).effective
    assert effective.model.freeze == ["vision_tower", "projector"]  # the service cannot resolve them
    inventory = WorkerInventory(cpu_slots=2, cores=2, workspace=str(workspace), runs_dir=str(workspace / "r"))
    events = run_host_check(effective.model_dump(mode="json"), inventory, [0]).events()
    (freeze,) = [e for e in events if e["data"]["path"] == "model.freeze"]
    assert freeze["kind"] == "preflight" and freeze["severity"] == "info"
    assert freeze["data"]["value"] == [r"^model\.vision_tower\.", r"^model\.multi_modal_projector\."]


@pytest.mark.parametrize("model", [QWEN, "models/tiny-qwen2-5-vl", LLAVA])
def test_each_family_trains_a_step_on_real_images_with_lora_in_the_language_model(
    model: str, workspace: Path
) -> None:
    recipe = parse_recipe(vl_recipe(model, adapter={"target_modules": ["language_model.q_proj"]}))
    loaded = load_model(recipe, str(workspace / model), local_rank=0, use_cpu=True)
    dataset = open_training_data(recipe.data.train, workspace, task=recipe.task)
    from flightdeck.worker.train.recipe_run import build_collator

    batch = build_collator(recipe, loaded)([dataset[0], dataset[1]])
    assert batch["pixel_values"].shape[0] > 0
    output = loaded.model(**batch)
    output.loss.backward()
    assert torch.isfinite(output.loss)
    grads = {n: p.grad for n, p in loaded.model.named_parameters() if p.requires_grad}
    assert (
        grads and all(".language_model." in n for n in grads) and all(g is not None for g in grads.values())
    )


def test_a_missing_image_file_is_a_d008_finding_at_host_preflight_not_an_agent_failure(
    workspace: Path, tmp_path: Path
) -> None:
    # The OCR-VQA case: the jsonl names ocr_images/nope_0.png, which is not there.
    rows = [
        {"image": f"ocr_images/nope_{i}.png", "questions": ["Title?"], "answers": ["x"]} for i in range(4)
    ]
    (tmp_path / "ocr.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = vl_recipe(data={"train": [{"path": str(tmp_path / "ocr.jsonl"), "preset": "ocrvqa"}]})
    findings = host_findings(recipe, workspace).findings
    (d008,) = [f for f in findings if f.code == "D008"]
    assert d008.severity == "error" and d008.path == "data.train[0].path"
    assert "row 1" in d008.message and "'nope_0.png' does not exist" in d008.message
