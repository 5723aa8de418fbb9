"""G012: the pad token is the EOS token and the collator masks pad positions, so EOS is never a label.

DataCollatorForLanguageModeling(mlm=False) sets `labels[input_ids == pad_token_id] = -100`; with
`pad_token = eos_token` (a common way to give Llama-style tokenizers a pad token) that masks every EOS
too, and the fine-tuned model never learns to stop (trl#1623, mlabonne/llm-course#33). The check runs
the collator actually used on a few real rows and looks at the labels it produced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

IGNORE_INDEX = -100
# Enough rows to hold a short and a long sample (the longest row has no padding, only its own EOS).
SAMPLE_ROWS = 4


def rows_with_masked_eos(batch: Mapping[str, Any], eos_id: int) -> list[int]:
    """Rows that are trained on (some label supervised) and hold an EOS among their real tokens, none of
    them supervised: the collator treated the row's own EOS as padding."""
    ids, labels = batch.get("input_ids"), batch.get("labels")
    if not isinstance(ids, torch.Tensor) or not isinstance(labels, torch.Tensor) or ids.shape != labels.shape:
        return []
    mask = batch.get("attention_mask")
    real = (
        mask.bool()
        if isinstance(mask, torch.Tensor) and mask.shape == ids.shape
        else torch.ones_like(ids, dtype=torch.bool)
    )
    eos = (ids == eos_id) & real
    supervised = labels != IGNORE_INDEX
    return [
        row
        for row in range(ids.shape[0])
        if eos[row].any() and supervised[row].any() and not (eos[row] & supervised[row]).any()
    ]


def pads_with_eos(tokenizer: Any) -> bool:
    pad, eos = getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)
    return pad is not None and pad == eos


def masked_eos_message(tokenizer: Any, rows: Sequence[int], checked: int, collator: str) -> str:
    return (
        f"the tokenizer pads with its EOS token ({tokenizer.eos_token!r}, id {tokenizer.eos_token_id}) and "
        f"{collator} masks pad positions in the labels: in {len(rows)} of {checked} sample rows every EOS "
        "is labelled -100, so EOS is never supervised and the fine-tuned model never learns to stop "
        "(trl#1623). Give the tokenizer a distinct pad token (an existing special one such as unk, or "
        "'<|finetune_right_pad_id|>' where the vocabulary has it), or mask by the attention mask instead "
        "of by token id"
    )


def collated_sample_rows(dataloader: Any) -> Mapping[str, Any] | None:
    """The dataloader's own collator over its dataset's first rows (no batch is drawn from the loader, so
    the run's order and its workers are untouched); None when the dataset cannot be indexed."""
    dataset = getattr(dataloader, "dataset", None)
    collate = getattr(dataloader, "collate_fn", None)
    if dataset is None or collate is None or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    try:
        rows = [dataset[i] for i in range(min(SAMPLE_ROWS, len(dataset)))]
        batch = collate(rows) if rows else None
    except Exception:  # the user's collator on the user's rows: the run itself will say what is wrong
        return None
    return batch if isinstance(batch, Mapping) else None


def _collator_tokenizer(collate: Any) -> Any:
    """The tokenizer an HF collator holds (the Trainer may wrap it in RemoveColumnsCollator)."""
    inner = getattr(collate, "data_collator", collate)
    return getattr(inner, "tokenizer", None)


def masked_eos_event(tokenizer: Any, dataloader: Any) -> Any:
    """G012 as a run-time warning for a script job: its own collator on its dataset's first rows."""
    from flightdeck.worker.train.health import HealthEvent

    tokenizer = tokenizer or _collator_tokenizer(getattr(dataloader, "collate_fn", None))
    if tokenizer is None or not pads_with_eos(tokenizer):
        return None
    batch = collated_sample_rows(dataloader)
    if batch is None:
        return None
    rows = rows_with_masked_eos(batch, tokenizer.eos_token_id)
    if not rows:
        return None
    inner = getattr(dataloader.collate_fn, "data_collator", dataloader.collate_fn)
    name = getattr(inner, "__name__", None) or type(inner).__name__
    message = masked_eos_message(tokenizer, rows, int(batch["input_ids"].shape[0]), f"the collator ({name})")
    return HealthEvent(
        "G012",
        "warn",
        message,
        fix="tokenizer.pad_token = tokenizer.unk_token (or another existing special token that is not EOS)",
        step=0,
        data={"rows": rows, "eos_token_id": tokenizer.eos_token_id},
    )
