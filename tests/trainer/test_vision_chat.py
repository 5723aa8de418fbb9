"""Vision-language chat data as TRL and LLaVA write it: `{"type": "image"}` parts in user turns with the
images in an `images` column (a `datasets` list of Image features, saved with to_parquet), or the image
inside the part (`{"type": "image", "image": "imgs/a.png"}` in a jsonl). Rendered with the model's chat
template, loss on assistant turns only; a missing image is D008 and an image part without an image D011,
each naming the row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from flightdeck.recipe import parse_recipe
from flightdeck.recipe.schema import DataSource
from flightdeck.worker.train.data import iter_samples, open_training_data
from flightdeck.worker.train.image_text import IGNORE_INDEX
from flightdeck.worker.train.model import load_model
from flightdeck.worker.train.recipe_run import build_collator

from .test_vision_language import LLAVA, QWEN, _png, host_findings, vl_recipe


def _text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def _trl_parquet(tmp_path: Path, rows: int = 4) -> Path:
    """A TRL-style set (like HuggingFaceH4/llava-instruct-mix-vsft): every turn a list of parts, the images
    a list of Image features, written by `datasets` itself."""
    from datasets import Dataset, Features, Image, List, Value
    from PIL import Image as PILImage

    part = {"type": Value("string"), "text": Value("string")}
    features = Features(
        {"messages": List({"role": Value("string"), "content": List(part)}), "images": List(Image())}
    )
    conversation = [
        {"role": "user", "content": [{"type": "image", "text": None}, _text("What is bar 3?")]},
        {"role": "assistant", "content": [_text("42")]},
        {"role": "user", "content": [_text("And bar 4?")]},
        {"role": "assistant", "content": [_text("17")]},
    ]
    data = {
        "messages": [conversation] * rows,
        "images": [[PILImage.new("RGB", (56, 56), "gray")] for _ in range(rows)],
    }
    path = tmp_path / "vsft" / "train.parquet"
    path.parent.mkdir()
    Dataset.from_dict(data, features=features).to_parquet(str(path))
    return path


def test_a_trl_style_set_trains_with_loss_on_the_assistant_turns_only(
    workspace: Path, tmp_path: Path
) -> None:
    path = _trl_parquet(tmp_path)
    source = {"path": str(path), "preset": "messages"}
    recipe = parse_recipe(vl_recipe(QWEN, data={"train": [source]}))
    dataset = open_training_data(recipe.data.train, workspace, task="vision_language")
    assert len(dataset) == 4 and dataset[0]["images"][0]["bytes"][:4] == b"\x89PNG"  # undecoded struct
    loaded = load_model(recipe, str(workspace / QWEN), local_rank=0, use_cpu=True)
    batch = build_collator(recipe, loaded)([dataset[0], dataset[1]])
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    processor = loaded.processor
    supervised = processor.tokenizer.decode(
        [t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
    )
    assert supervised == "42<|im_end|>\n17<|im_end|>\n"  # both answers; no user text, no scaffolding
    image_tokens = ids.count(processor.image_token_id)
    assert image_tokens == int(batch["image_grid_thw"][0].prod()) // 4 > 0  # one image, its own count
    output = loaded.model(**batch)
    output.loss.backward()
    assert torch.isfinite(output.loss)
    assert all(p.grad is not None for p in loaded.model.parameters() if p.requires_grad)


def test_trl_prompt_completion_rows_train_only_the_completion(workspace: Path, tmp_path: Path) -> None:
    """TRL's vision prompt-completion shape: the prompt's turns (an earlier answer among them) and the
    completion's turns in two columns, the images in a third; and its text form, a prompt and an answer."""
    from datasets import Dataset, Features, Image, List, Value
    from PIL import Image as PILImage

    turn = {"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})}
    features = Features({"prompt": List(turn), "completion": List(turn), "images": List(Image())})
    prompt = [
        {"role": "user", "content": [{"type": "image", "text": None}, _text("What is bar 3?")]},
        {"role": "assistant", "content": [_text("42")]},
        {"role": "user", "content": [_text("And bar 4?")]},
    ]
    rows = {
        "prompt": [prompt] * 2,
        "completion": [[{"role": "assistant", "content": [_text("17")]}]] * 2,
        "images": [[PILImage.new("RGB", (56, 56), "gray")] for _ in range(2)],
    }
    turns = tmp_path / "turns.parquet"
    Dataset.from_dict(rows, features=features).to_parquet(str(turns))
    text = tmp_path / "text.parquet"
    text_rows = {"prompt": ["What is bar 3?"] * 2, "completion": ["42"] * 2, "images": rows["images"]}
    Dataset.from_dict(
        text_rows,
        features=Features(
            {"prompt": Value("string"), "completion": Value("string"), "images": List(Image())}
        ),
    ).to_parquet(str(text))
    sources = [{"path": str(p), "preset": "prompt_completion"} for p in (turns, text)]
    recipe = parse_recipe(vl_recipe(QWEN, data={"train": sources}))
    dataset = open_training_data(recipe.data.train, workspace, task="vision_language")
    loaded = load_model(recipe, str(workspace / QWEN), local_rank=0, use_cpu=True)
    batch = build_collator(recipe, loaded)([dataset[0], dataset[2]])
    tokenizer = loaded.processor.tokenizer
    supervised = [
        tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])
        for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True)
    ]
    assert supervised[0] == "17<|im_end|>\n"  # the completion; the prompt's answer "42" is context
    assert supervised[1].startswith("42")  # the text form: the completion after the prompt and the image
    assert all(ids.count(loaded.processor.image_token_id) > 0 for ids in batch["input_ids"].tolist())


def test_an_image_inside_the_part_is_read_from_beside_the_jsonl(workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(_png(32, 32))
    turns = [
        {"role": "system", "content": "You read charts."},
        {"role": "user", "content": [{"type": "image", "image": "imgs/a.png"}, _text("Title?")]},
        {"role": "assistant", "content": "Sales"},
    ]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    source = DataSource(path=str(tmp_path / "chat.jsonl"), preset="messages")
    (sample,) = iter_samples(source, workspace, task="vision_language")
    assert sample["images"] == [{"bytes": None, "path": str(tmp_path / "imgs" / "a.png")}]
    assert json.loads(sample["messages"])[1]["content"][0] == {"type": "image"}
    recipe = parse_recipe(vl_recipe(LLAVA, data={"train": [source.model_dump()]}))
    loaded = load_model(recipe, str(workspace / LLAVA), local_rank=0, use_cpu=True)
    batch = build_collator(recipe, loaded)([sample])
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    supervised = [t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
    assert loaded.processor.tokenizer.decode(supervised).strip() == "Sales</s>"
    assert ids.count(loaded.processor.image_token_id) == loaded.processor.tokens_per_image({}, 0)


def test_a_missing_image_is_d008_and_a_part_without_an_image_is_d011_naming_the_row(
    workspace: Path, tmp_path: Path
) -> None:
    def turns(part: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [part, _text("Title?")]}, {"role": "assistant", "content": "x"}]

    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "ok.png").write_bytes(_png(56, 56))
    missing = [{"messages": turns({"type": "image", "image": f"imgs/{name}.png"})} for name in ("ok", "nope")]
    (tmp_path / "missing.jsonl").write_text("".join(json.dumps(r) + "\n" for r in missing))
    unpaired = [{"messages": turns({"type": "image"}), "images": []} for _ in range(2)]
    (tmp_path / "unpaired.jsonl").write_text("".join(json.dumps(r) + "\n" for r in unpaired))
    sources = [
        {"path": str(tmp_path / name), "preset": "messages"} for name in ("missing.jsonl", "unpaired.jsonl")
    ]
    findings = host_findings(vl_recipe(QWEN, data={"train": sources}), workspace).findings
    (d008,) = [f for f in findings if f.code == "D008"]
    assert d008.path == "data.train[0].path" and d008.severity == "error"
    assert "row 2" in d008.message and "'nope.png' does not exist" in d008.message
    assert d008.fix and d008.fix.startswith("row 2: put 'nope.png' where the row's image path points")
    (d011,) = [f for f in findings if f.code == "D011"]
    assert d011.path == "data.train[1].path" and d011.severity == "error"
    assert (
        "row 1" in d011.message and "places 1 image(s)" in d011.message and "has 0 image(s)" in d011.message
    )
    assert d011.fix and d011.fix.startswith("row 1: give every image part its image")
