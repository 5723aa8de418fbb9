"""`make-tiny-model` and `make-demo-data` build usable artefacts from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from transformers import AutoConfig, AutoTokenizer
from typer.testing import CliRunner

from cli import tiny_cmd


def _app() -> typer.Typer:
    app = typer.Typer()
    tiny_cmd.register(app)
    return app


def test_make_demo_data_writes_every_dataset_shape(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["make-demo-data", str(tmp_path), "--text-lines", "50"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "chartqa").iterdir()) == ["train.jsonl", "val.jsonl"]
    row = json.loads((tmp_path / "ocrvqa.jsonl").read_text().splitlines()[0])
    assert len(row["questions"]) == len(row["answers"]) >= 2
    assert len((tmp_path / "corpus.txt").read_text().splitlines()) == 50
    for name in ("infovqa.parquet", "infovqa.csv", "alpaca.json"):
        assert (tmp_path / name).stat().st_size > 0


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
