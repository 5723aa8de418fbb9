"""Vision-language chat samples ({"messages", "images"}) as model inputs: loss on assistant turns only.

The conversation is rendered with the model's chat template, as text-only chat is (worker/train/chat.py:
the assistant spans are what each assistant turn adds to the render that ends with the generation
prompt). Each `{"type": "image"}` part renders as the template's image placeholder; the placeholder is
then repeated as many times as the image yields tokens (image_text.ImageTextProcessor), outside every
assistant span, so the spans keep their text and only the assistant's tokens are supervised.

Findings, naming the sample's row: D011 when the turns' image parts and the row's images do not pair up
(a part with no image left for it, or an image no part places); D008 when an image file is missing or
undecodable (image_text.load_image); V001 when max_seq_length would cut image tokens.

Public API: encode_sample(processor, sample, max_seq_length) -> EncodedSample, for a chat sample or a
    question/answer one (the collator and host preflight call it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flightdeck.worker.train.chat import NO_ASSISTANT_FIX, supervised_spans
from flightdeck.worker.train.data_errors import DataSourceError
from flightdeck.worker.train.image_text import IGNORE_INDEX, EncodedSample, ImageTextProcessor, load_image


def encode_sample(
    processor: ImageTextProcessor, sample: Mapping[str, Any], max_seq_length: int
) -> EncodedSample:
    """One sample's ids, labels and image tensors, whichever shape it has."""
    if sample.get("messages") is not None:  # null: the other form's column of a prompt-completion source
        return encode_chat(processor, sample, max_seq_length)
    return processor.encode(sample, max_seq_length)


def _turns(sample: Mapping[str, Any]) -> list[dict[str, Any]]:
    value = sample["messages"]
    return list(json.loads(value) if isinstance(value, str) else value)


def with_blank_image_part(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """V003's fix for a chat row without images: an image part first in its first user turn."""
    out, placed = [], False
    for turn in turns:
        if not placed and turn.get("role") == "user":
            content = turn.get("content")
            parts = content if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
            turn, placed = {**turn, "content": [{"type": "image"}, *parts]}, True
        out.append(turn)
    return out


def encode_chat(
    processor: ImageTextProcessor, sample: Mapping[str, Any], max_seq_length: int
) -> EncodedSample:
    """input_ids and labels (assistant turns only; a prompt-completion row's completion) and the image
    tensors of one chat sample."""
    row = sample.get("row")
    where = f"row {row}: " if row is not None else ""
    turns = _turns(sample)
    full, spans = supervised_spans(processor.tokenizer, turns, sample.get("prompt_turns"))
    placeholders = full.count(processor.image_token)
    refs = list(sample.get("images") or [])
    if placeholders != len(refs):
        raise DataSourceError(
            "D011",
            f"{where}the conversation places {placeholders} image(s) ({{'type': 'image'}} parts in its turns) "
            f"but the row has {len(refs)} image(s) (the images column, or 'image' inside a part)",
            fix=f"{where}give every image part its image, in order, and every image a part in a user turn",
        )
    if not spans:
        raise DataSourceError(
            "D010", "no assistant turn of this conversation can be found in its render", fix=NO_ASSISTANT_FIX
        )
    images = [load_image(ref, row=row) for ref in refs]
    image_inputs: dict[str, Any] = {}
    if images:
        image_inputs = dict(processor.image_processor(images=images, return_tensors="pt"))
    # Cut the render at the assistant spans' edges; repeat each placeholder outside them.
    pieces, edges, counter = [], [], iter(range(len(images)))
    cursor = 0
    for start, end in [*spans, (len(full), len(full))]:
        outside = full[cursor:start].split(processor.image_token)
        expanded = outside[0] + "".join(
            processor.image_token * processor.tokens_per_image(image_inputs, next(counter)) + piece
            for piece in outside[1:]
        )
        pieces.append(expanded)
        begin = sum(map(len, pieces))
        pieces.append(full[start:end])
        edges.append((begin, begin + end - start))
        cursor = end
    text = "".join(pieces)
    encoded = processor.tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    input_ids = list(encoded["input_ids"])
    labels = [
        token if end > start and any(start < right and end > left for left, right in edges) else IGNORE_INDEX
        for token, (start, end) in zip(input_ids, encoded["offset_mapping"], strict=True)
    ]
    image_positions = [i for i, token in enumerate(input_ids) if token == processor.image_token_id]
    if image_positions and image_positions[-1] >= max_seq_length:
        raise DataSourceError(
            "V001",
            f"{where}a conversation needs {image_positions[-1] + 1} tokens up to its last image token "
            f"({len(image_positions)} image tokens) but max_seq_length is {max_seq_length}: truncating would cut "
            "image tokens ('Image features and image tokens do not match')",
            fix=f"raise data.max_seq_length above {image_positions[-1] + 1}, or shrink the images "
            "(data.max_pixels)",
        )
    return EncodedSample(input_ids[:max_seq_length], labels[:max_seq_length], image_inputs)
