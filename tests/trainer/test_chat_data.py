"""Chat data: the messages and ShareGPT formats rendered with the model's chat template, loss on the
assistant's tokens only (system and multi-turn allowed); D010 when no assistant token can be found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flightdeck.recipe.schema import DataSource
from flightdeck.worker.train.chat import (
    NO_ASSISTANT,
    NO_ASSISTANT_FIX,
    NO_TEMPLATE,
    NO_TEMPLATE_FIX,
    chat_problem,
)
from flightdeck.worker.train.collate import CausalLMCollator, tokenize_causal
from flightdeck.worker.train.data import iter_samples, open_dataset

# ChatML as Qwen and many instruct models write it; the second marks the assistant's tokens as TRL asks.
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_GENERATION = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Renders the number of turns first: a render with one more turn never extends the shorter one.
NOT_NESTED = "{{ messages|length }}" + CHATML

CONVERSATION = [
    {"role": "system", "content": "You read charts."},
    {"role": "user", "content": "What is the value of bar 3?"},
    {"role": "assistant", "content": "42"},
    {"role": "user", "content": "And bar 4?"},
    {"role": "assistant", "content": "17"},
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from flightdeck.worker.tiny.tokenizer import train_tokenizer

    return train_tokenizer()


def _supervised_text(tokenizer: Any, template: str) -> str:
    tokenizer.chat_template = template
    encoded = tokenize_causal(
        {"messages": json.dumps(CONVERSATION)}, tokenizer, prompt_template="", max_seq_length=512
    )
    return tokenizer.decode(
        [t for t, label in zip(encoded["input_ids"], encoded["labels"], strict=True) if label != -100]
    )


@pytest.mark.parametrize("template", [CHATML, CHATML_GENERATION], ids=["turn-diff", "generation-block"])
def test_only_assistant_turns_are_supervised(tokenizer: Any, template: str) -> None:
    supervised = _supervised_text(tokenizer, template)
    assert "42<|im_end|>" in supervised and "17<|im_end|>" in supervised  # both turns, and where they end
    assert "bar" not in supervised and "charts" not in supervised  # user and system turns masked
    assert "<|im_start|>assistant" not in supervised  # the template's scaffolding masked


def test_no_template_and_unfindable_turns_are_d010(tokenizer: Any) -> None:
    sample = {"messages": json.dumps(CONVERSATION)}
    tokenizer.chat_template = None
    assert chat_problem(sample, tokenizer) == (NO_TEMPLATE, NO_TEMPLATE_FIX)
    tokenizer.chat_template = NOT_NESTED
    assert chat_problem(sample, tokenizer) == (NO_ASSISTANT, NO_ASSISTANT_FIX)
    tokenizer.chat_template = CHATML
    assert chat_problem(sample, tokenizer) is None
    # With {% generation %} blocks the tokenizer's own mask is used: renders need not nest.
    tokenizer.chat_template = "{{ messages|length }}" + CHATML_GENERATION
    assert chat_problem(sample, tokenizer) is None


def _as_parts(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's and TRL's conversational shape: each content a list of typed parts."""
    return [{**t, "content": [{"type": "text", "text": t["content"]}]} for t in turns]


@pytest.mark.parametrize("template", [CHATML, CHATML_GENERATION], ids=["turn-diff", "generation-block"])
def test_content_given_as_text_parts_trains_as_the_same_text(tokenizer: Any, template: str) -> None:
    tokenizer.chat_template = template
    as_text = tokenize_causal(
        {"messages": json.dumps(CONVERSATION)}, tokenizer, prompt_template="", max_seq_length=512
    )
    parts = {"messages": json.dumps(_as_parts(CONVERSATION))}
    assert chat_problem(parts, tokenizer) is None
    assert tokenize_causal(parts, tokenizer, prompt_template="", max_seq_length=512) == as_text


def test_a_conversation_the_template_cannot_render_is_d010_naming_the_error(tokenizer: Any) -> None:
    tokenizer.chat_template = CHATML  # concatenates content as a string
    with_image = _as_parts(CONVERSATION)
    with_image[1]["content"].insert(0, {"type": "image"})
    problem = chat_problem({"messages": json.dumps(with_image)}, tokenizer)
    assert problem is not None
    message, fix = problem
    assert "cannot render this conversation: TypeError" in message and fix and "vision_language" in fix


def test_sharegpt_conversations_become_messages(tmp_path: Path, tokenizer: Any) -> None:
    rows = [
        {
            "conversations": [
                {"from": "system", "value": "You read charts."},
                {"from": "human", "value": "What is the value of bar 3?"},
                {"from": "gpt", "value": "42"},
            ]
        }
    ] * 4
    (tmp_path / "sg.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = open_dataset(DataSource(path="sg.jsonl", preset="sharegpt"), tmp_path, task="causal_lm")
    assert [turn["role"] for turn in json.loads(dataset[0]["messages"])] == ["system", "user", "assistant"]
    tokenizer.chat_template = CHATML
    batch = CausalLMCollator(tokenizer, prompt_template="", max_seq_length=128)([dataset[0], dataset[1]])
    assert batch["input_ids"].shape[0] == 2 and int((batch["labels"] != -100).sum()) > 0


def test_messages_saved_by_datasets_as_parquet(tmp_path: Path) -> None:
    from datasets import Dataset

    (tmp_path / "chat" / "data").mkdir(parents=True)
    Dataset.from_list([{"messages": CONVERSATION}] * 3).to_parquet(
        tmp_path / "chat" / "data" / "train-00000-of-00001.parquet"
    )
    (sample,) = iter_samples(DataSource(path="chat", preset="messages"), tmp_path, limit=1)
    assert json.loads(sample["messages"]) == CONVERSATION


def test_a_conversation_without_an_assistant_answer_is_blank(tmp_path: Path) -> None:
    rows = [{"messages": CONVERSATION}, {"messages": CONVERSATION[:2]}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = open_dataset(DataSource(path="c.jsonl", preset="messages"), tmp_path, task="causal_lm")
    assert (len(dataset), dataset.blank_rows) == (1, [2])  # D008: nothing to train on in line 2
