"""`make-tiny-model` and `make-demo-data` build usable artefacts from the command line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import typer
from transformers import AutoConfig, AutoTokenizer
from typer.testing import CliRunner

from flightdeck.cli import tiny_cmd


def _app() -> typer.Typer:
    app = typer.Typer()
    tiny_cmd.register(app)
    return app


def test_make_demo_data_writes_every_dataset_shape(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["make-demo-data", str(tmp_path), "--text-lines", "50"])
    assert result.exit_code == 0, result.output
    shards = sorted(p.name for p in (tmp_path / "chartqa" / "data").iterdir())
    assert shards == ["train-00000-of-00001.parquet", "val-00000-of-00001.parquet"]  # a Hub snapshot
    row = json.loads((tmp_path / "ocrvqa.jsonl").read_text().splitlines()[0])
    assert len(row["questions"]) == len(row["answers"]) >= 2
    assert len((tmp_path / "corpus.txt").read_text().splitlines()) == 50
    for name in ("infovqa.parquet", "infovqa.csv", "alpaca.json"):
        assert (tmp_path / name).stat().st_size > 0
    _image_datasets_open_with_pillow(tmp_path)


def _image_datasets_open_with_pillow(root: Path) -> None:
    """The image sets in the shapes the real ones come in, every image a PNG pillow can decode."""
    import pyarrow.parquet as pq
    from PIL import Image

    def opens(image: Image.Image) -> None:
        with image:
            assert image.format == "PNG" and image.size == (56, 56)
            image.load()  # the pixels decode, not only the header

    splits = sorted(p.name for p in (root / "chartqa-vl").iterdir())
    assert splits == ["test.parquet", "train.parquet", "val.parquet"]
    for split in splits:
        rows = pq.read_table(root / "chartqa-vl" / split).to_pylist()
        assert rows and all(isinstance(row["label"], list) for row in rows)
        for row in rows:  # HF struct {bytes, path}
            opens(Image.open(io.BytesIO(row["image"]["bytes"])))
    info = [json.loads(line) for line in (root / "infovqa-vl.jsonl").read_text().splitlines()]
    assert info and all(isinstance(row["answers"], list) and row["question"] for row in info)
    for row in info:  # a path relative to the dataset file
        opens(Image.open(root / row["image"]))
    ocr = pq.read_table(root / "ocrvqa-vl.parquet").to_pylist()
    assert ocr and all(len(row["questions"]) == len(row["answers"]) for row in ocr)
    for row in ocr:  # raw bytes
        opens(Image.open(io.BytesIO(row["image"])))


def test_make_tiny_model_qwen2_vl_loads_offline_as_model_and_processor(tmp_path: Path) -> None:
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    from flightdeck.worker.train.image_text import ImageTextProcessor

    result = CliRunner().invoke(_app(), ["make-tiny-model", str(tmp_path / "vl"), "--arch", "qwen2_vl"])
    assert result.exit_code == 0, result.output
    config = AutoConfig.from_pretrained(tmp_path / "vl")
    assert config.model_type == "qwen2_vl" and config.vision_config.hidden_size == 64
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "vl")
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    image_processor = AutoImageProcessor.from_pretrained(tmp_path / "vl")
    assert image_processor.patch_size == config.vision_config.patch_size  # no V002 out of the box
    processor = ImageTextProcessor.from_pretrained(tmp_path / "vl")
    assert processor.tokenizer.chat_template is not None
    assert processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
    assert config.text_config.vocab_size >= len(processor.tokenizer)


def test_make_tiny_model_bert_has_a_mask_token(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["make-tiny-model", str(tmp_path / "bert"), "--arch", "bert"])
    assert result.exit_code == 0, result.output
    config = AutoConfig.from_pretrained(tmp_path / "bert")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "bert")
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("bert", 64, 2)
    assert tokenizer.mask_token_id is not None and config.vocab_size == len(tokenizer)


def test_make_demo_workspace_builds_everything_once_and_keeps_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["make-demo-workspace", str(tmp_path)])
    assert result.exit_code == 0, result.output
    models = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert models == [
        "tiny-bert",
        "tiny-llama",
        "tiny-llava-siglip",
        "tiny-qwen2",
        "tiny-qwen2-5-vl",
        "tiny-qwen2-vl",
    ]
    weights = tmp_path / "models/tiny-llama/model.safetensors"
    before = weights.stat().st_mtime_ns
    (tmp_path / "models/tiny-qwen2/.complete").unlink()  # as if interrupted while writing it
    assert CliRunner().invoke(_app(), ["make-demo-workspace", str(tmp_path)]).exit_code == 0
    assert weights.stat().st_mtime_ns == before  # complete: kept
    assert (tmp_path / "models/tiny-qwen2/.complete").is_file()  # incomplete: built again
