"""TRL's prompt-completion datasets (preset `prompt_completion`), in the shapes TRL and `datasets` write
them: text rows train the completion after the prompt as given (no prompt_template around it);
conversational rows train only what the completion's turns add to the rendered prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flightdeck.recipe.schema import DataSource
from flightdeck.worker.train.collate import CausalLMCollator, tokenize_causal
from flightdeck.worker.train.data import DataSourceError, StreamedSource, iter_samples, open_dataset

from .test_chat_data import CHATML, CHATML_GENERATION

TEMPLATE = "Question: {question}\nAnswer: "  # the recipe's default: a text row must not get it
TEXT_ROWS = [
    {"prompt": "The sky is", "completion": " blue."},
    {"prompt": "Two plus two is", "completion": " four."},
]
# As TRL's conversational prompt-completion datasets hold them; the prompt has an earlier exchange.
CONVERSATION_ROWS = [
    {
        "prompt": [
            {"role": "system", "content": "You read charts."},
            {"role": "user", "content": "What is bar 3?"},
            {"role": "assistant", "content": "forty"},
            {"role": "user", "content": "And bar 4?"},
        ],
        "completion": [{"role": "assistant", "content": "seventeen"}],
    }
] * 3


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from flightdeck.worker.tiny.tokenizer import train_tokenizer

    return train_tokenizer()


def _supervised(tokenizer: Any, encoded: dict[str, list[int]]) -> str:
    ids = [t for t, label in zip(encoded["input_ids"], encoded["labels"], strict=True) if label != -100]
    return str(tokenizer.decode(ids))


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    from datasets import Dataset

    Dataset.from_list(rows).to_parquet(str(path))  # turns become Arrow list<struct>, as on the Hub
    return path


def test_text_rows_train_the_completion_after_the_prompt_as_given(tmp_path: Path, tokenizer: Any) -> None:
    source = DataSource(path=str(_jsonl(tmp_path / "pc.jsonl", TEXT_ROWS)), preset="prompt_completion")
    dataset = open_dataset(source, tmp_path, task="causal_lm")
    sample = dataset[0]
    encoded = tokenize_causal(sample, tokenizer, prompt_template=TEMPLATE, max_seq_length=64)
    assert tokenizer.decode(encoded["input_ids"]) == "<s>The sky is blue.</s>"  # no "Question:" around it
    assert _supervised(tokenizer, encoded).replace(" ", "") == "blue.</s>"  # the completion and EOS
    # A recipe's template for its other sources (naming their columns) is not this source's concern.
    alpaca = tokenize_causal(sample, tokenizer, prompt_template="### {instruction}\n", max_seq_length=64)
    assert alpaca == encoded
    batch = CausalLMCollator(tokenizer, prompt_template=TEMPLATE, max_seq_length=64)([dataset[0], dataset[1]])
    assert batch["input_ids"].shape[0] == 2


@pytest.mark.parametrize("template", [CHATML, CHATML_GENERATION], ids=["turn-diff", "generation-block"])
def test_conversational_rows_train_only_the_completions_turns(
    tmp_path: Path, tokenizer: Any, template: str
) -> None:
    tokenizer.chat_template = template
    path = _parquet(tmp_path / "pc.parquet", CONVERSATION_ROWS)
    dataset = open_dataset(DataSource(path=str(path), preset="prompt_completion"), tmp_path, task="causal_lm")
    assert len(dataset) == 3
    supervised = _supervised(
        tokenizer, tokenize_causal(dataset[0], tokenizer, prompt_template=TEMPLATE, max_seq_length=256)
    )
    assert "seventeen<|im_end|>" in supervised
    assert "forty" not in supervised  # the prompt's own assistant turn is context, not a target
    assert "<|im_start|>assistant" not in supervised and "bar" not in supervised


def test_streamed_sources_of_either_form_reach_the_collator(tmp_path: Path, tokenizer: Any) -> None:
    """A stream's samples keep the other form's columns as nulls: they must not be taken for the form."""
    tokenizer.chat_template = CHATML
    collate = CausalLMCollator(tokenizer, prompt_template=TEMPLATE, max_seq_length=256)
    for path in (
        _jsonl(tmp_path / "text.jsonl", TEXT_ROWS),
        _parquet(tmp_path / "turns.parquet", CONVERSATION_ROWS),
    ):
        source = DataSource(path=str(path), preset="prompt_completion", streaming=True)
        samples = list(StreamedSource(source, tmp_path, task="causal_lm").samples)
        batch = collate(samples)
        supervised = [
            _supervised(tokenizer, {"input_ids": i.tolist(), "labels": lab.tolist()})
            for i, lab in zip(batch["input_ids"], batch["labels"], strict=True)
        ]
        wanted = "blue" if path.suffix == ".jsonl" else "seventeen"
        assert wanted in supervised[0] and "Question" not in tokenizer.decode(batch["input_ids"][0])


def test_prompt_completion_columns_without_the_preset_are_d001_naming_it(tmp_path: Path) -> None:
    source = DataSource(path=str(_jsonl(tmp_path / "pc.jsonl", TEXT_ROWS)))
    with pytest.raises(DataSourceError) as caught:
        open_dataset(source, tmp_path, task="causal_lm")
    assert caught.value.code == "D001"
    assert 'set the source\'s "preset": "prompt_completion"' in (caught.value.fix or "")


def test_turns_mapped_onto_question_and_answer_are_d001_not_their_printed_form(tmp_path: Path) -> None:
    """The map users reached for before the preset: each turn would have trained as "{'role': ...}"."""
    path = _jsonl(tmp_path / "turns.jsonl", CONVERSATION_ROWS[:1])
    source = DataSource(path=str(path), fields={"question": "prompt", "answer": "completion"})
    with pytest.raises(DataSourceError) as caught:
        list(iter_samples(source, tmp_path))
    assert caught.value.code == "D001" and "chat turns" in caught.value.message
    assert '"prompt_completion"' in (caught.value.fix or "")
    # The same turns written as JSON text (a csv's cells) would have trained as that text.
    import csv

    with (tmp_path / "turns.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "completion"])
        row = CONVERSATION_ROWS[0]
        writer.writerow([json.dumps(row["prompt"]), json.dumps(row["completion"])])
    source = DataSource(
        path=str(tmp_path / "turns.csv"), fields={"question": "prompt", "answer": "completion"}
    )
    with pytest.raises(DataSourceError) as caught:
        list(iter_samples(source, tmp_path))
    assert caught.value.code == "D001" and "chat turns" in caught.value.message


def test_a_row_mixing_text_and_turns_is_d001(tmp_path: Path) -> None:
    row = {"prompt": "Say hi", "completion": [{"role": "assistant", "content": "hi"}]}
    source = DataSource(path=str(_jsonl(tmp_path / "mixed.jsonl", [row])), preset="prompt_completion")
    with pytest.raises(DataSourceError) as caught:
        list(iter_samples(source, tmp_path))
    assert (
        caught.value.code == "D001" and "prompt is text and its completion is turns" in caught.value.message
    )


def test_turns_saved_as_json_text_in_a_csv_are_conversations(tmp_path: Path, tokenizer: Any) -> None:
    import csv

    path = tmp_path / "pc.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "completion"])
        row = CONVERSATION_ROWS[0]
        writer.writerow([json.dumps(row["prompt"]), json.dumps(row["completion"])])
        writer.writerow(["[INST] a text prompt [/INST]", " an answer"])  # text that starts with '['
    samples = list(iter_samples(DataSource(path=str(path), preset="prompt_completion"), tmp_path))
    assert samples[0]["prompt_turns"] == 4 and "messages" in samples[0]
    assert samples[1] == {
        "question": "[INST] a text prompt [/INST]",
        "answer": " an answer",
        "untemplated": True,
    }


def test_an_empty_or_null_completion_is_a_blank_row(tmp_path: Path) -> None:
    """Left out and counted (D008), never a fatal D001 for the whole source: the trainer maps every row,
    host preflight only the first ones. A null is what Parquet holds for a filtered row's list."""
    empty = {**CONVERSATION_ROWS[0], "completion": [{"role": "assistant", "content": ""}]}
    rows = [*CONVERSATION_ROWS[:2], empty, {**CONVERSATION_ROWS[0], "completion": None}]
    dataset = open_dataset(
        DataSource(path=str(_parquet(tmp_path / "pc.parquet", rows)), preset="prompt_completion"),
        tmp_path,
        task="causal_lm",
    )
    assert len(dataset) == 2 and dataset.blank_rows == [3, 4]
    text = [*TEXT_ROWS, {"prompt": "Say hi", "completion": None}, {"prompt": None, "completion": None}]
    source = DataSource(path=str(_parquet(tmp_path / "text.parquet", text)), preset="prompt_completion")
    dataset = open_dataset(source, tmp_path, task="causal_lm")
    assert len(dataset) == 2 and dataset.blank_rows == [3, 4]
