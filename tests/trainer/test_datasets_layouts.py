"""Data sources as users have them, written by the real tools: `datasets`' save_to_disk and to_parquet,
Hub-sharded split names, `<split>/` folders, pyarrow with image structs; streaming; hub ids offline."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from flightdeck.recipe.schema import DataSource
from flightdeck.worker.train.data import DataSourceError, iter_samples, open_dataset, open_training_data
from flightdeck.worker.train.quoting import QUOTE_CHARS, quote

QA = [{"query": f"value of bar {i}?", "label": [str(i)]} for i in range(12)]


def _dataset(rows: list[dict]):  # type: ignore[no-untyped-def]
    from datasets import Dataset

    return Dataset.from_list(rows)


def test_save_to_disk_dataset_dict_picks_the_split(tmp_path: Path) -> None:
    from datasets import DatasetDict

    DatasetDict({"train": _dataset(QA), "validation": _dataset(QA[:3])}).save_to_disk(tmp_path / "saved")
    assert (tmp_path / "saved" / "dataset_dict.json").is_file()
    train = open_dataset(DataSource(path="saved", preset="chartqa"), tmp_path, task="causal_lm")
    valid = open_dataset(
        DataSource(path="saved", preset="chartqa", split="validation"), tmp_path, task="causal_lm"
    )
    assert (len(train), len(valid)) == (12, 3)
    assert train[0]["question"] == "value of bar 0?" and train[0]["answer"] == "0"
    with pytest.raises(DataSourceError) as caught:
        open_dataset(DataSource(path="saved", preset="chartqa", split="val"), tmp_path, task="causal_lm")
    assert caught.value.code == "D003" and "did you mean 'validation'" in caught.value.message


def test_save_to_disk_single_dataset(tmp_path: Path) -> None:
    _dataset([{"text": f"line {i}"} for i in range(5)]).save_to_disk(tmp_path / "one")
    dataset = open_dataset(DataSource(path="one"), tmp_path, task="masked_lm")
    assert [dataset[i]["text"] for i in range(5)] == [f"line {i}" for i in range(5)]


def test_hub_sharded_parquet_with_several_shards_is_one_split(tmp_path: Path) -> None:
    # As push_to_hub names them: data/<split>-<i>-of-<n>.parquet, written by datasets' own to_parquet.
    (tmp_path / "snap" / "data").mkdir(parents=True)
    for shard in range(2):
        rows = QA[shard * 6 : (shard + 1) * 6]
        _dataset(rows).to_parquet(tmp_path / "snap" / "data" / f"train-0000{shard}-of-00002.parquet")
    _dataset(QA[:2]).to_parquet(tmp_path / "snap" / "data" / "test-00000-of-00001.parquet")
    train = open_dataset(DataSource(path="snap", preset="chartqa"), tmp_path, task="causal_lm")
    assert len(train) == 12
    test = list(iter_samples(DataSource(path="snap", preset="chartqa", split="test"), tmp_path, limit=None))
    assert len(test) == 2


def test_split_folders_and_files_named_after_splits(tmp_path: Path) -> None:
    for split, count in (("train", 4), ("validation", 2)):
        (tmp_path / "folders" / split).mkdir(parents=True)
        _dataset(QA[:count]).to_csv(tmp_path / "folders" / split / "part-0.csv", index=False)
    (tmp_path / "named").mkdir()
    _dataset(QA[:5]).to_json(tmp_path / "named" / "train.jsonl")
    _dataset(QA[:1]).to_json(tmp_path / "named" / "val.jsonl")
    fields = {"question": "query", "answer": "label"}
    assert len(open_dataset(DataSource(path="folders", fields=fields), tmp_path, task="causal_lm")) == 4
    valid = DataSource(path="folders", fields=fields, split="validation")
    assert len(open_dataset(valid, tmp_path, task="causal_lm")) == 2
    # datasets calls val.jsonl 'validation'; the name in the file works too (today's recipes say 'val').
    for split in ("val", "validation"):
        source = DataSource(path="named", preset="chartqa", split=split)
        assert len(open_dataset(source, tmp_path, task="causal_lm")) == 1


def test_single_arrow_file(tmp_path: Path) -> None:
    import pyarrow as pa

    table = pa.Table.from_pylist([{"text": "one"}, {"text": "two"}])
    with pa.OSFile(str(tmp_path / "c.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    dataset = open_dataset(DataSource(path="c.arrow"), tmp_path, task="masked_lm")
    assert [dataset[0]["text"], dataset[1]["text"]] == ["one", "two"]


def test_image_feature_columns_arrive_undecoded_and_decode_in_the_collator(tmp_path: Path) -> None:
    from datasets import Features, Image, Sequence, Value
    from PIL import Image as PILImage

    from flightdeck.worker.train.image_text import load_image

    buffer = io.BytesIO()
    PILImage.new("RGB", (20, 10), "red").save(buffer, format="PNG")
    features = Features({"image": Image(), "query": Value("string"), "label": Sequence(Value("string"))})
    rows = [{"image": {"bytes": buffer.getvalue(), "path": None}, "query": "q?", "label": ["1"]}] * 3
    _dataset(rows).cast(features).save_to_disk(tmp_path / "vl")
    dataset = open_dataset(DataSource(path="vl", preset="chartqa"), tmp_path, task="vision_language")
    sample = dataset[1]
    assert sample["images"][0]["bytes"][:4] == b"\x89PNG" and sample["row"] == 2
    assert load_image(sample["images"][0], row=sample["row"]).size == (20, 10)


def test_a_missing_image_file_is_a_d008_naming_the_row_and_the_file(tmp_path: Path) -> None:
    from flightdeck.worker.train.image_text import load_image

    rows = [{"image": "ocr_images/nope_0.png", "questions": ["t?"], "answers": ["x"]}]
    (tmp_path / "ocr.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (sample,) = iter_samples(DataSource(path="ocr.jsonl", preset="ocrvqa"), tmp_path, task="vision_language")
    with pytest.raises(DataSourceError) as caught:
        load_image(sample["images"][0], row=1)
    assert caught.value.code == "D008"
    assert "row 1" in caught.value.message and "'nope_0.png' does not exist" in caught.value.message
    (tmp_path / "ocr_images").mkdir()
    (tmp_path / "ocr_images" / "nope_0.png").write_bytes(b"not a png at all")
    with pytest.raises(DataSourceError) as broken:
        load_image(sample["images"][0], row=1)
    assert broken.value.code == "D008" and "cannot be decoded from byte offset 0" in broken.value.message


def test_a_compressed_file_is_read_by_the_extension_under_its_compression(tmp_path: Path) -> None:
    import bz2
    import gzip

    from flightdeck.worker.train.data import row_unit

    rows = "".join(json.dumps({"question": f"{i} plus 1?", "answer": str(i + 1)}) + "\n" for i in range(3))
    (tmp_path / "qa.jsonl.gz").write_bytes(gzip.compress(rows.encode()))
    (tmp_path / "qa.csv.bz2").write_bytes(bz2.compress(b"question,answer\n0 plus 1?,1\n"))
    for name, count in (("qa.jsonl.gz", 3), ("qa.csv.bz2", 1)):
        source = DataSource(path=name)
        dataset = open_dataset(source, tmp_path, task="causal_lm")
        assert len(dataset) == count and dataset[0]["answer"] == "1", name
        assert row_unit(source, tmp_path) == "row"  # a compressed file's lines are not numbered
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(b'{"text": oops}\n'))
    with pytest.raises(DataSourceError) as caught:
        open_dataset(DataSource(path="bad.jsonl.gz"), tmp_path, task="masked_lm")
    assert caught.value.code == "D012" and "oops" not in caught.value.message
    assert "byte offset" not in caught.value.message  # no line of the compressed bytes is named


def test_a_bad_jsonl_line_is_named_with_its_byte_offset(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(DataSourceError) as caught:
        open_dataset(DataSource(path="bad.jsonl"), tmp_path, task="masked_lm")
    assert "line 2 (byte offset 17) is not a JSON object" in caught.value.message
    assert "oops" not in caught.value.message  # the file's content is never quoted


def test_a_hub_id_offline_names_hf_hub_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataSourceError) as caught:
        list(iter_samples(DataSource(path="HuggingFaceM4/ChartQA", preset="chartqa"), tmp_path))
    assert "HF_HUB_OFFLINE=1" in caught.value.message
    assert caught.value.fix and "huggingface-cli download" in caught.value.fix


def test_d001_lists_the_columns_and_names_the_preset_that_reads_them(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    (tmp_path / "chat.jsonl").write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(DataSourceError) as caught:
        list(iter_samples(DataSource(path="chat.jsonl"), tmp_path))
    assert caught.value.code == "D001" and "'messages'" in caught.value.message
    # The fix column holds the fix, not the message.
    assert 'set the source\'s "preset": "messages"' in (caught.value.fix or "")


def test_findings_quote_at_most_a_short_prefix_of_a_column_name(tmp_path: Path) -> None:
    secret = "s3cr3t-" + "x" * 60
    (tmp_path / "keys.jsonl").write_text(json.dumps({secret: 1}) + "\n")
    with pytest.raises(DataSourceError) as caught:
        list(iter_samples(DataSource(path="keys.jsonl"), tmp_path))
    assert secret not in caught.value.message and secret[:QUOTE_CHARS] in caught.value.message
    assert quote(secret) == repr(secret[:QUOTE_CHARS]) + "..."


def test_alpaca_columns_keep_their_names_for_the_prompt_template(workspace: Path) -> None:
    sample = next(iter_samples(DataSource(path="data/alpaca.json", preset="alpaca"), workspace))
    assert sample["instruction"] == "Answer the question about the chart."
    assert sample["input"].startswith("What is the value") and sample["output"].isdigit()
    "{instruction}\n{input}\n{output}".format_map(sample)


def test_a_streamed_source_reads_without_a_length(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text("".join(f"line {i}\n" if i % 5 else "\n" for i in range(50)))
    stream = open_training_data([DataSource(path="corpus.txt", streaming=True)], tmp_path, task="masked_lm")
    assert isinstance(stream, IterableDataset)  # no length: training.max_steps ends the run (D009)
    texts = [sample["text"] for sample in stream]
    assert len(texts) == 40 and texts[0] == "line 1"  # blank lines skipped as they pass


def test_masked_lm_texts_are_tokenised_once_into_a_cache_file_named_by_content(workspace: Path) -> None:
    from transformers import AutoTokenizer

    from flightdeck.worker.train.collate import MaskedLMCollator

    tokenizer = AutoTokenizer.from_pretrained(workspace / "models" / "tiny-bert")
    source = [DataSource(path="data/corpus.txt", preset="text", max_samples=64)]

    def cache_file(max_seq_length: int) -> tuple[str, Any]:
        data = open_training_data(
            source, workspace, task="masked_lm", tokenizer=tokenizer, max_seq_length=max_seq_length
        )
        (one,) = data.datasets
        return one.samples.cache_files[0]["filename"], data

    first, data = cache_file(32)
    again, _ = cache_file(32)
    other, _ = cache_file(16)
    assert first == again != other  # reused for the same content and settings; a new file otherwise
    sample = data[0]
    first_text = next(
        line for line in (workspace / "data/corpus.txt").read_text().splitlines() if line.strip()
    )
    assert sample["input_ids"] == tokenizer(first_text, truncation=True, max_length=32)["input_ids"]
    # Only the ids are in the tokenised file: a copy of the text beside them would double its pages.
    assert set(sample) == {"input_ids"}
    assert data.datasets[0].samples.features["input_ids"].feature.dtype == "uint16"  # a small vocabulary
    assert data.datasets[0].canonical is None  # the texts' file is no longer mapped by the rank
    batch = MaskedLMCollator(tokenizer, max_seq_length=32)([data[0], data[1]])
    assert batch["input_ids"].shape[0] == 2


def test_a_masked_lm_corpus_in_hub_shards_is_tokenised_with_its_blank_rows_named(
    workspace: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    texts = [f"the market share of region {i}" if i % 7 else "  " for i in range(40)]
    whole = _dataset([{"text": t} for t in texts])
    (tmp_path / "corpus" / "data").mkdir(parents=True)
    for index in range(2):  # data/train-0000i-of-00002.parquet, as the Hub keeps a split
        whole.shard(2, index, contiguous=True).to_parquet(
            str(tmp_path / "corpus" / "data" / f"train-{index:05d}-of-00002.parquet")
        )
    tokenizer = AutoTokenizer.from_pretrained(workspace / "models" / "tiny-bert")
    data = open_training_data(
        [DataSource(path="corpus", preset="text")],
        tmp_path,
        task="masked_lm",
        tokenizer=tokenizer,
        max_seq_length=16,
    )
    (source,) = data.datasets
    assert source.blank_rows == [1, 8, 15, 22, 29, 36]  # 1-based rows of the split, both shards
    kept = [t for t in texts if t.strip()]
    assert len(data) == len(kept) == 34
    assert [data[i]["input_ids"] for i in (0, 33)] == tokenizer(
        [kept[0], kept[33]], max_length=16, truncation=True
    )["input_ids"]
