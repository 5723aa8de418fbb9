"""A real workspace for host preflight tests: tiny llama directories and small datasets on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LINES = [f"question {i} about the chart of value {i * 7} and colour {i % 5}" for i in range(60)]


def _tokenizer(with_pad: bool) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"] + (["<pad>"] if with_pad else [])
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(LINES, trainer=trainer)
    extra = {"pad_token": "<pad>"} if with_pad else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", **extra
    )


def write_tiny_llama(directory: Path, *, dtype: str = "float32", with_pad: bool = False) -> Path:
    """LlamaConfig hidden 64, 2 layers, saved with save_pretrained next to its tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer(with_pad)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def build_workspace(root: Path) -> Path:
    """models/{tiny-llama (fp32, no pad), tiny-llama-bf16 (pad)}, data/{qa, chartqa, ocrvqa, long}."""
    write_tiny_llama(root / "models" / "tiny-llama")
    write_tiny_llama(root / "models" / "tiny-llama-bf16", dtype="bfloat16", with_pad=True)
    _jsonl(root / "data" / "qa.jsonl", [{"question": f"q {i}", "answer": f"a {i}"} for i in range(40)])
    chartqa = [{"query": f"value of bar {i}?", "label": [str(i)]} for i in range(40)]
    _jsonl(root / "data" / "chartqa_flat.jsonl", chartqa)
    # As the Hub keeps ChartQA: `datasets`' own parquet writer, shards named data/<split>-0000i-of-0000n.
    from datasets import Dataset

    (root / "data" / "chartqa" / "data").mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", chartqa), ("val", chartqa[:8])):
        Dataset.from_list(rows).to_parquet(
            root / "data" / "chartqa" / "data" / f"{split}-00000-of-00001.parquet"
        )
    ocr = [{"questions": [f"title {i}?", f"author {i}?"], "answers": [f"t{i}", f"a{i}"]} for i in range(10)]
    _jsonl(root / "data" / "ocrvqa.jsonl", ocr)
    _jsonl(root / "data" / "long.jsonl", [{"question": " ".join(LINES[:8]), "answer": "yes"}] * 4)
    return root
