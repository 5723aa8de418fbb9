"""Tokenisation and batching; CPU only, because it runs inside spawned DataLoader workers (E001).

Public API (host preflight imports it, D005):
    tokenize_causal(sample, tokenizer, *, prompt_template, max_seq_length) -> {"input_ids", "labels"}
        Prompt tokens are masked to -100; answer tokens and EOS are supervised; the whole is cut to
        max_seq_length. `supervised_tokens(encoded)` counts labels != -100: 0 means D005 (all masked).
    CausalLMCollator(tokenizer, prompt_template, max_seq_length)(samples) -> padded batch of tensors.
    MaskedLMCollator(tokenizer, max_seq_length, mlm_probability)(samples) -> MLM batch of tensors.
The collators raise DataSourceError("D004") on an example without its fields (what a dataset that
arrived empty delivers, R3) and "D008" on a blank one (the keys are there, the text is empty).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import torch

from flightdeck.worker.train.chat import messages_of, tokenize_chat
from flightdeck.worker.train.data_errors import DataSourceError
from flightdeck.worker.train.quoting import quote_all

IGNORE_INDEX = -100


def template_fields(prompt_template: str) -> list[str]:
    """Field names a prompt template uses, e.g. ['question'] for 'Question: {question}'."""
    return [name for _, name, _, _ in string.Formatter().parse(prompt_template) if name]


def tokenize_causal(
    sample: dict[str, str], tokenizer: Any, *, prompt_template: str, max_seq_length: int
) -> dict[str, list[int]]:
    """One sample -> input_ids and labels, with the prompt masked and the answer supervised; a chat sample
    ("messages") through the model's chat template, only assistant turns supervised (worker/train/chat.py)."""
    if sample.get("messages") is not None:  # null: the other form's column of a prompt-completion source
        return tokenize_chat(sample, tokenizer, max_seq_length=max_seq_length)
    missing = [name for name in template_fields(prompt_template) if name not in sample]
    if missing and not sample.get("untemplated"):
        raise DataSourceError(
            "D001",
            f"prompt_template uses {{{missing[0]}}} but samples have only: {quote_all(sample)}",
            available_fields=list(sample),
            fix=f"use only these names in data.prompt_template ({{question}} and {{answer}} always exist), or "
            f"map a column to '{missing[0][:40]}' in the source's 'fields'",
        )
    check_not_empty(sample, ("question", "answer"))
    prompt_ids = tokenizer(prompt_text(sample, prompt_template), add_special_tokens=True)["input_ids"]
    answer_ids = tokenizer(sample["answer"], add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        answer_ids = [*answer_ids, tokenizer.eos_token_id]
    input_ids = (prompt_ids + answer_ids)[:max_seq_length]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_seq_length]
    return {"input_ids": input_ids, "labels": labels}


def prompt_text(sample: dict[str, Any], prompt_template: str) -> str:
    """The text before a question/answer sample's answer: the template filled in, or, for a
    prompt-completion source's text rows ("untemplated"), the prompt as the dataset gives it."""
    return str(sample["question"]) if sample.get("untemplated") else prompt_template.format_map(sample)


def check_not_empty(sample: dict[str, Any], fields: Sequence[str]) -> None:
    """D004 when the example has none of its fields (it arrived empty); D008 when one is blank."""
    if not any(name in sample for name in fields):
        raise DataSourceError(
            "D004",
            f"an example arrived without its fields (keys: {quote_all(sample)}): the dataset arrived empty",
            fix="load the dataset inside each process from its files (a source path), never pass rows held "
            "in memory; with num_workers 0 the loader sends no copy",
        )
    blank = [name for name in fields if not str(sample.get(name) or "").strip()]
    if blank:
        raise DataSourceError(
            "D008",
            f"an example has a blank {', '.join(blank)}",
            fix=f"fill in or remove the rows whose {', '.join(blank)} is empty",
        )


def supervised_tokens(encoded: dict[str, list[int]]) -> int:
    """How many label positions are trained on; 0 makes the loss NaN (D005)."""
    return sum(1 for label in encoded["labels"] if label != IGNORE_INDEX)


def _pad(rows: Sequence[list[int]], value: int) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=torch.long)


class CausalLMCollator:
    """Samples -> right-padded input_ids, attention_mask and labels (padding masked to -100)."""

    def __init__(self, tokenizer: Any, *, prompt_template: str, max_seq_length: int):
        self.tokenizer = tokenizer
        self.prompt_template = prompt_template
        self.max_seq_length = max_seq_length

    def __call__(self, samples: Sequence[dict[str, str]]) -> dict[str, torch.Tensor]:
        encoded = [
            tokenize_causal(
                s, self.tokenizer, prompt_template=self.prompt_template, max_seq_length=self.max_seq_length
            )
            for s in samples
        ]
        ids = [e["input_ids"] for e in encoded]
        return {
            "input_ids": _pad(ids, self.tokenizer.pad_token_id),
            "attention_mask": _pad([[1] * len(row) for row in ids], 0),
            "labels": _pad([e["labels"] for e in encoded], IGNORE_INDEX),
        }


class MaskedLMCollator:
    """Text samples -> tokenised, padded batch with 15 % of tokens masked (the standard MLM collator)."""

    def __init__(self, tokenizer: Any, *, max_seq_length: int, mlm_probability: float = 0.15):
        from transformers import DataCollatorForLanguageModeling

        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.mlm = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability)

    def __call__(self, samples: Sequence[dict[str, str]]) -> dict[str, torch.Tensor]:
        if all("input_ids" in sample for sample in samples):  # tokenised once, in the datasets cache
            rows = [{"input_ids": list(sample["input_ids"])[: self.max_seq_length]} for sample in samples]
            return dict(self.mlm(rows))
        for sample in samples:
            check_not_empty(sample, ("text",))
        texts = [sample["text"] for sample in samples]
        encoded = self.tokenizer(texts, truncation=True, max_length=self.max_seq_length)
        rows = [{"input_ids": ids} for ids in encoded["input_ids"]]
        return dict(self.mlm(rows))


class VisionLanguageCollator:
    """Image + question -> answer samples through the model's chat template and image processor.

    `blank_image_for_text_rows` (V003's fix) gives a text-only row a blank image, so that under DDP every
    rank runs the trainable tower and projector in every step and the ranks agree on which parameters get
    gradients.
    """

    def __init__(self, processor: Any, *, max_seq_length: int, blank_image_for_text_rows: bool = False):
        self.processor = processor
        self.max_seq_length = max_seq_length
        self.blank_image_for_text_rows = blank_image_for_text_rows

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        from flightdeck.worker.train.image_chat import encode_sample, with_blank_image_part
        from flightdeck.worker.train.image_text import blank_image

        encoded = []
        for sample in samples:
            chat = sample.get("messages") is not None  # a conversation (worker/train/image_chat.py)
            check_not_empty(sample, ("messages",) if chat else ("question", "answer"))
            if self.blank_image_for_text_rows and not sample.get("images"):
                sample = {**sample, "images": [blank_image()]}
                if chat:
                    sample["messages"] = with_blank_image_part(messages_of(sample))
            encoded.append(encode_sample(self.processor, sample, self.max_seq_length))
        return self.processor.collate(encoded)
