"""Data sources: presets, field maps, split names, flattening, and cheap, lazy pickling (R1, R3)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from flightdeck.recipe.schema import DataSource
from flightdeck.worker.train.data import DataSourceError, iter_samples, open_dataset, open_training_data


def test_chartqa_labels_as_lists_give_the_first_answer(workspace: Path) -> None:
    source = DataSource(path="data/chartqa", preset="chartqa", split="train")
    samples = list(iter_samples(source, workspace, limit=6))
    assert len(samples) == 6
    assert all(isinstance(s["answer"], str) and s["answer"].isdigit() for s in samples)
    assert samples[0]["question"].startswith("What is the value")


def test_missing_split_names_the_splits_that_exist(workspace: Path) -> None:
    source = DataSource(path="data/chartqa", preset="chartqa", split="validation")
    with pytest.raises(DataSourceError) as caught:
        list(iter_samples(source, workspace))
    assert caught.value.code == "D003"
    assert caught.value.available_splits == ["train", "val"]  # data/val-00000-of-00001.parquet
    assert "did you mean 'val'" in caught.value.message


def test_missing_fields_list_the_fields_that_exist(workspace: Path) -> None:
    # InfoVQA read with the default question/answer map: 'question' does not exist (R1 failure 1).
    source = DataSource(path="data/infovqa.parquet")
    with pytest.raises(DataSourceError) as caught:
        list(iter_samples(source, workspace))
    assert caught.value.code == "D001"
    assert caught.value.available_fields == ["query", "answer"]
    assert "question<-'question'" in caught.value.message


def test_explicit_fields_override_the_preset(workspace: Path) -> None:
    source = DataSource(path="data/infovqa.csv", fields={"question": "query", "answer": "answer"})
    assert next(iter_samples(source, workspace))["question"].startswith("Which colour")


def test_ocrvqa_rows_are_flattened_to_one_sample_per_pair(workspace: Path) -> None:
    source = DataSource(path="data/ocrvqa.jsonl", preset="ocrvqa")
    rows = [line for line in (workspace / "data/ocrvqa.jsonl").read_text().splitlines() if line]
    pairs = sum(len(json.loads(row)["questions"]) for row in rows)
    dataset = open_dataset(source, workspace, task="causal_lm")
    assert len(rows) < len(dataset) == pairs
    assert all(dataset[i]["question"] and dataset[i]["answer"] for i in range(len(dataset)))


def test_alpaca_input_is_appended_to_the_instruction(workspace: Path) -> None:
    sample = next(iter_samples(DataSource(path="data/alpaca.json", preset="alpaca"), workspace))
    assert sample["question"].startswith("Answer the question about the chart.\nWhat is the value")
    assert sample["answer"].isdigit()


def test_max_samples_caps_a_source(workspace: Path) -> None:
    source = DataSource(path="data/chartqa", preset="chartqa", max_samples=7)
    assert len(open_dataset(source, workspace, task="causal_lm")) == 7


def test_mixed_sources_concatenate(workspace: Path) -> None:
    sources = [
        DataSource(path="data/chartqa", preset="chartqa"),
        DataSource(path="data/infovqa.parquet", preset="infovqa"),
    ]
    assert len(open_training_data(sources, workspace, task="causal_lm")) == 200 + 200


_CHILD = """
import json, pickle, sys
dataset = pickle.load(open(sys.argv[1], "rb"))
print(json.dumps([len(dataset), dataset[0], dataset[len(dataset) - 1]]))
"""


def test_dataset_pickles_small_and_reloads_in_a_spawned_process(workspace: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line number {i} of the corpus\n\n" for i in range(20_000)))
    dataset = open_dataset(DataSource(path=str(corpus), preset="text"), workspace, task="masked_lm")
    assert len(dataset) == 20_000 and len(dataset.blank_rows) == 20_000  # blank lines are not samples (D008)
    assert len(pickle.dumps(dataset)) < 8_000  # references to the Arrow cache files, never the corpus (D004)
    # A fresh interpreter, like a spawned DataLoader worker or another rank.
    (tmp_path / "dataset.pkl").write_bytes(pickle.dumps(dataset))
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "dataset.pkl")],
        capture_output=True,
        text=True,
        check=True,
    )
    length, first, last = json.loads(child.stdout)
    assert length == 20_000
    assert (first, last) == (
        {"text": "line number 0 of the corpus"},
        {"text": "line number 19999 of the corpus"},
    )


def test_a_pickled_dataset_reads_the_arrow_copy_even_if_the_source_file_changes(tmp_path: Path) -> None:
    # R3's D004 cannot happen: a copy in a rank or loader worker maps the same Arrow file, never re-parses.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b\nc d\n")
    dataset = open_dataset(DataSource(path=str(corpus)), tmp_path, task="masked_lm")
    copy = pickle.loads(pickle.dumps(dataset))
    corpus.write_text("x\n")
    assert (len(copy), copy[0], copy[1]) == (2, {"text": "a b"}, {"text": "c d"})


def test_blank_rows_are_left_out_with_their_row_numbers_and_never_called_d004(tmp_path: Path) -> None:
    rows = [{"query": "q1", "label": "1"}, {"query": "q2", "label": ""}, {"query": "", "label": "3"}]
    rows += [{"query": "q4", "label": "4"}]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = open_dataset(DataSource(path=str(path), preset="chartqa"), tmp_path, task="causal_lm")
    assert len(dataset) == 2 and dataset.blank_rows == [2, 3]
    assert [dataset[i]["question"] for i in range(2)] == ["q1", "q4"]
    text = tmp_path / "text.jsonl"
    text.write_text('{"text": ""}\n{"text": "a line"}\n')
    single = open_dataset(DataSource(path=str(text), preset="text"), tmp_path, task="masked_lm")
    assert (len(single), single.blank_rows, single[0]) == (1, [1], {"text": "a line"})


def test_blank_rows_are_numbered_by_the_files_lines_and_empty_text_lines_count(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    rows = [{"query": "q1", "label": "1"}, None, {"query": "q3", "label": "3"}, {"query": "q4", "label": ""}]
    path.write_text("".join((json.dumps(r) if r else "") + "\n" for r in rows))  # line 2 is empty
    dataset = open_dataset(DataSource(path=str(path), preset="chartqa"), tmp_path, task="causal_lm")
    assert (len(dataset), dataset.blank_rows) == (2, [4])  # the file's line 4, not the third record
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one\n\nthree\n \nfive\n")
    text = open_dataset(DataSource(path=str(corpus)), tmp_path, task="masked_lm")
    assert (len(text), text.blank_rows) == (3, [2, 4])
    assert [text[i]["text"] for i in range(3)] == ["one", "three", "five"]
    pickled = pickle.loads(pickle.dumps(text))
    assert [pickled[i]["text"] for i in range(3)] == ["one", "three", "five"]  # rebuilt the same way


def test_a_dataset_of_blank_rows_only_says_so(tmp_path: Path) -> None:
    path = tmp_path / "blank.jsonl"
    path.write_text('{"text": " "}\n')
    with pytest.raises(DataSourceError) as caught:
        open_dataset(DataSource(path=str(path), preset="text"), tmp_path, task="masked_lm")
    assert caught.value.code == "D007" and "D008" in caught.value.message
    assert caught.value.fix is not None and str(path) in caught.value.fix  # a fix of its own, not in the text
