"""Chat samples ({"messages": [{role, content}, ...]}) as input_ids and labels: loss on assistant turns only.

The conversation is rendered with the model's own chat template. Which tokens are the assistant's:
  - a template that marks them with `{% generation %}` answers `apply_chat_template(...,
    return_assistant_tokens_mask=True)` directly (the tokenizer's own mask, as TRL uses it);
  - any other template is rendered turn by turn: the assistant turn i is what the conversation up to i
    adds to the conversation before it with the generation prompt (`add_generation_prompt=True`), so the
    template's scaffolding ("<|im_start|>assistant\n") stays masked and its end-of-turn token is trained.
A template whose renders do not nest (a date injected per render, a turn rewritten by a later one) finds
no assistant span: every label is -100. That, and a model without a template, is D010, caught in host
preflight on sample rows (the trainer would otherwise train on nothing: loss NaN or 0).

A prompt-completion conversation ("prompt_turns": how many turns are the prompt's) supervises what its
completion adds to the prompt rendered with the generation prompt, with either kind of template.

Public API: tokenize_chat(sample, tokenizer, *, max_seq_length) -> {"input_ids", "labels"} (the causal
    collator calls it for samples with "messages"); chat_problem(sample, tokenizer) -> D010 (message, fix) | None.
"""

from __future__ import annotations

import json
from typing import Any

from flightdeck.worker.train.data_errors import DataSourceError

IGNORE_INDEX = -100
NO_TEMPLATE = (
    "the model's tokenizer has no chat_template, so chat data (preset 'messages', 'sharegpt', or "
    "'prompt_completion' with turns) cannot be "
    "rendered and no assistant token can be found: every label would be -100"
)
NO_TEMPLATE_FIX = (
    "use a model whose tokenizer_config.json (or chat_template.jinja) has a chat template, e.g. the instruct "
    "or chat variant, or put one in the model directory (chat_template.jinja)"
)
NO_ASSISTANT = (
    "the model's chat template renders the conversation so that its assistant turns cannot be found (the "
    "render with the assistant turn does not extend the render that ends with the generation prompt), so "
    "assistant-only loss masks every token"
)
NO_ASSISTANT_FIX = (
    "give the template a {% generation %} ... {% endgeneration %} block around assistant content, or use a "
    "template whose turns render in order (no date or text that changes between renders)"
)


def messages_of(sample: dict[str, Any]) -> list[dict[str, Any]]:
    value = sample.get("messages")
    turns = json.loads(value) if isinstance(value, str) else value
    return list(turns or [])


def text_turns(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation for a text model: a turn whose content is a list of text parts (OpenAI's and TRL's
    conversational shape, `[{"type": "text", "text": ...}]`) gets them joined, as templates written for
    vision-language models join them; most text models' templates concatenate content as a string."""
    turns = messages_of(sample)
    for index, turn in enumerate(turns):
        content = turn.get("content") if isinstance(turn, dict) else None
        if (
            isinstance(content, list)
            and content
            and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content
            )
        ):
            turns[index] = {**turn, "content": "".join(p["text"] for p in content)}
    return turns


def _render(tokenizer: Any, turns: list[dict[str, Any]], *, generation_prompt: bool) -> str:
    return str(tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt))


def _unrenderable(exc: Exception) -> DataSourceError:
    return DataSourceError(
        "D010",
        f"the model's chat template cannot render this conversation: {type(exc).__name__}: {exc}",
        fix="give each turn's content in the shape the template reads (a string for most text models' "
        "templates; lists of text parts are joined, other parts such as images need task vision_language), "
        "or use a template written for this shape",
    )


def _assistant_spans(tokenizer: Any, turns: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The full render and the character spans of its assistant turns (empty when they cannot be found)."""
    full = _render(tokenizer, turns, generation_prompt=False)
    spans = []
    for index, turn in enumerate(turns):
        if turn.get("role") != "assistant":
            continue
        before = _render(tokenizer, turns[:index], generation_prompt=True) if index else ""
        through = _render(tokenizer, turns[: index + 1], generation_prompt=False)
        if not through.startswith(before) or not full.startswith(through) or len(through) == len(before):
            return full, []
        spans.append((len(before), len(through)))
    return full, spans


def supervised_spans(
    tokenizer: Any, turns: list[dict[str, Any]], prompt_turns: int | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """The full render and the character spans trained on: every assistant turn's or, for a
    prompt-completion row (`prompt_turns`: how many turns are the prompt's), what the completion adds to
    the prompt rendered with the generation prompt, as TRL's completion-only loss takes it (the prompt's
    own assistant turns are context). Empty when the renders do not nest."""
    if prompt_turns is None:
        return _assistant_spans(tokenizer, turns)
    full = _render(tokenizer, turns, generation_prompt=False)
    before = _render(tokenizer, turns[:prompt_turns], generation_prompt=True)
    return full, [(len(before), len(full))] if full.startswith(before) and len(full) > len(before) else []


def _uses_generation_blocks(tokenizer: Any) -> bool:
    template = tokenizer.chat_template
    return isinstance(template, str) and "{% generation %}" in template.replace("{%-", "{%").replace(
        "-%}", "%}"
    )


def tokenize_chat(
    sample: dict[str, Any], tokenizer: Any, *, max_seq_length: int | None
) -> dict[str, list[int]]:
    """input_ids and labels of one conversation; only assistant tokens are supervised."""
    if tokenizer.chat_template is None:
        raise DataSourceError("D010", NO_TEMPLATE, fix=NO_TEMPLATE_FIX)
    turns = text_turns(sample)
    prompt_turns = sample.get("prompt_turns")
    if prompt_turns is None and _uses_generation_blocks(tokenizer):
        try:
            encoded = tokenizer.apply_chat_template(
                turns, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
        except Exception as exc:  # the template is the user's code: any error is its verdict on the data
            raise _unrenderable(exc) from exc
        input_ids = list(encoded["input_ids"])
        mask = list(encoded["assistant_masks"])
        labels = [token if keep else IGNORE_INDEX for token, keep in zip(input_ids, mask, strict=True)]
    else:
        try:
            full, spans = supervised_spans(tokenizer, turns, prompt_turns)
        except Exception as exc:
            raise _unrenderable(exc) from exc
        return _labelled(tokenizer, full, spans, max_seq_length)
    if max_seq_length is not None:
        input_ids, labels = input_ids[:max_seq_length], labels[:max_seq_length]
    return {"input_ids": input_ids, "labels": labels}


def _labelled(
    tokenizer: Any, text: str, spans: list[tuple[int, int]], max_seq_length: int | None
) -> dict[str, list[int]]:
    """The rendered conversation's ids, a token supervised where it overlaps one of the character spans."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = list(encoded["input_ids"])
    labels = [
        token if any(start < end_span and end > begin for begin, end_span in spans) else IGNORE_INDEX
        for token, (start, end) in zip(input_ids, encoded["offset_mapping"], strict=True)
    ]
    if max_seq_length is not None:
        input_ids, labels = input_ids[:max_seq_length], labels[:max_seq_length]
    return {"input_ids": input_ids, "labels": labels}


def chat_problem(sample: dict[str, Any], tokenizer: Any) -> tuple[str, str | None] | None:
    """D010's (message, fix) when this conversation would have no supervised token whatever its length."""
    if tokenizer.chat_template is None:
        return NO_TEMPLATE, NO_TEMPLATE_FIX
    try:
        encoded = tokenize_chat(sample, tokenizer, max_seq_length=None)
    except DataSourceError as exc:
        return exc.message, exc.fix
    if not any(label != IGNORE_INDEX for label in encoded["labels"]):
        return NO_ASSISTANT, NO_ASSISTANT_FIX
    return None
