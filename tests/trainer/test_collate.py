"""Tokenisation: prompt masked, answer supervised, D005 when nothing is supervised, D004 on empty rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from flightdeck.worker.train.collate import (
    IGNORE_INDEX,
    CausalLMCollator,
    MaskedLMCollator,
    supervised_tokens,
    tokenize_causal,
)
from flightdeck.worker.train.data import DataSourceError

TEMPLATE = "Question: {question}\nAnswer: "


@pytest.fixture(scope="module")
def tokenizer(workspace: Path):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(workspace / "models" / "tiny-llama")


def test_prompt_is_masked_and_answer_plus_eos_supervised(tokenizer) -> None:  # type: ignore[no-untyped-def]
    sample = {"question": "Which colour is used for Peru?", "answer": "green"}
    encoded = tokenize_causal(sample, tokenizer, prompt_template=TEMPLATE, max_seq_length=128)
    prompt_len = len(tokenizer(TEMPLATE.format_map(sample))["input_ids"])
    answer = tokenizer("green", add_special_tokens=False)["input_ids"]
    assert encoded["labels"][:prompt_len] == [IGNORE_INDEX] * prompt_len
    assert encoded["labels"][prompt_len:] == [*answer, tokenizer.eos_token_id]
    assert encoded["input_ids"][prompt_len:] == encoded["labels"][prompt_len:]
    assert supervised_tokens(encoded) == len(answer) + 1


def test_prompt_longer_than_max_length_leaves_nothing_supervised(tokenizer) -> None:  # type: ignore[no-untyped-def]
    sample = {"question": "value " * 50, "answer": "7"}
    encoded = tokenize_causal(sample, tokenizer, prompt_template=TEMPLATE, max_seq_length=16)
    assert len(encoded["input_ids"]) == 16
    assert supervised_tokens(encoded) == 0  # what host preflight reports as D005


def test_template_field_missing_from_samples_is_d001(tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataSourceError) as caught:
        tokenize_causal(
            {"question": "q", "answer": "a"}, tokenizer, prompt_template="{query}", max_seq_length=8
        )
    assert caught.value.code == "D001"


def test_causal_collator_pads_right_and_masks_padding(tokenizer) -> None:  # type: ignore[no-untyped-def]
    collate = CausalLMCollator(tokenizer, prompt_template=TEMPLATE, max_seq_length=64)
    batch = collate(
        [{"question": "a", "answer": "1"}, {"question": "a much longer question here", "answer": "22"}]
    )
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    short = int(batch["attention_mask"][0].sum())
    assert short < batch["input_ids"].shape[1]
    assert (batch["input_ids"][0, short:] == tokenizer.pad_token_id).all()
    assert (batch["labels"][0, short:] == IGNORE_INDEX).all()


def test_masked_lm_collator_masks_some_tokens_and_rejects_empty_examples(workspace: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(workspace / "models" / "tiny-bert")
    collate = MaskedLMCollator(tokenizer, max_seq_length=32)
    batch = collate([{"text": "the model reads a chart " * 4}] * 8)
    assert (batch["labels"] != IGNORE_INDEX).any()
    with pytest.raises(DataSourceError) as caught:
        collate([{}])  # what a dataset pickled empty into a worker delivers (R3)
    assert caught.value.code == "D004"
    with pytest.raises(DataSourceError) as caught:
        collate([{"text": ""}])  # a blank row is a data-quality problem, not a pickling one
    assert caught.value.code == "D008"
