"""Catalog round three on real tiny models: G013 (tokens beyond the embeddings) and G015 (accumulation
with a forward that takes no loss kwargs), through run_host_preflight as the agent runs it."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from flightdeck.recipe.findings import Finding
from flightdeck.worker.host_preflight import run_host_preflight

from .factories import inventory, make_recipe

QA = {"data": {"train": [{"path": "data/qa.jsonl"}]}}


def _run(workspace: Path, *layers: dict[str, Any]) -> list[Finding]:
    return run_host_preflight(make_recipe(QA, *layers), inventory(), workspace, [], environ={}).findings


def _copy_model(workspace: Path, source: str) -> str:
    name = f"models/copy-{uuid.uuid4().hex[:8]}"
    shutil.copytree(workspace / source, workspace / name)
    return name


def test_g013_tokens_added_without_resizing_are_refused(workspace: Path) -> None:
    from transformers import AutoTokenizer

    model = _copy_model(workspace, "models/tiny-llama-bf16")
    tokenizer = AutoTokenizer.from_pretrained(workspace / model)
    # What a user's script does before saving: new tokens, the embeddings never resized.
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"], special_tokens=True)
    tokenizer.save_pretrained(workspace / model)

    g013 = [f for f in _run(workspace, {"model": {"path": model}}) if f.code == "G013"]
    assert len(g013) == 1 and g013[0].severity == "error" and g013[0].path == "model.path"
    assert f"{len(tokenizer)} tokens" in g013[0].message and "'<tool_call>'" in g013[0].message
    assert "resize_token_embeddings" in g013[0].message and "modules_to_save" in g013[0].message


def test_g013_healthy_model_and_a_larger_table_pass(workspace: Path) -> None:
    # A table larger than the tokenizer (vocabularies padded to a multiple of 64) is fine.
    assert not [f for f in _run(workspace, {"model": {"path": "models/tiny-llama-bf16"}}) if f.code == "G013"]


@pytest.fixture(scope="module")
def qwen2_5_vl(workspace: Path) -> str:
    from flightdeck.worker.tiny import make_tiny_model

    name = "models/tiny-qwen2-5-vl-g015"
    if not (workspace / name).is_dir():
        make_tiny_model(workspace / name, "qwen2_5_vl")
    return name


def test_g015_accumulation_with_a_forward_without_loss_kwargs_warns(workspace: Path, qwen2_5_vl: str) -> None:
    # Qwen2.5-VL declares accepts_loss_kwargs = False (transformers 5): the Trainer averages micro-batches.
    vision = {
        "task": "vision_language",
        "model": {"path": qwen2_5_vl},
        "adapter": {"target_modules": "all-linear"},
    }
    findings = _run(workspace, vision, {"training": {"gradient_accumulation_steps": 8}})
    g015 = [f for f in findings if f.code == "G015"]
    assert len(g015) == 1 and g015[0].severity == "warn"
    assert g015[0].path == "training.gradient_accumulation_steps"
    assert "Qwen2_5_VLForConditionalGeneration" in g015[0].message and "num_items_in_batch" in g015[0].message
    assert "per_device_batch_size by 8" in g015[0].message
    one = _run(workspace, vision, {"training": {"gradient_accumulation_steps": 1}})
    assert "G015" not in {f.code for f in one}


def test_g015_llama_forward_takes_loss_kwargs(workspace: Path) -> None:
    findings = _run(
        workspace,
        {"model": {"path": "models/tiny-llama-bf16"}, "training": {"gradient_accumulation_steps": 8}},
    )
    assert "G015" not in {f.code for f in findings}
