"""Tiny local models (llama, qwen2, bert; qwen2_vl, qwen2_5_vl, llava_siglip) with a BPE tokenizer trained
on the fly."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from flightdeck.worker.tiny.tokenizer import train_tokenizer
from flightdeck.worker.tiny.vision_model import VISION_ARCHS, make_tiny_vision_model

Arch = Literal["llama", "qwen2", "bert", "qwen2_vl", "qwen2_5_vl", "llava_siglip"]
ARCHS: tuple[Arch, ...] = ("llama", "qwen2", "bert", "qwen2_vl", "qwen2_5_vl", "llava_siglip")


def _config(arch: str, tokenizer):  # type: ignore[no-untyped-def]
    from transformers import BertConfig, LlamaConfig, Qwen2Config

    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 512,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if arch == "bert":
        return BertConfig(**common)
    causal = common | {
        "num_key_value_heads": 2,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "tie_word_embeddings": False,
    }
    return LlamaConfig(**causal) if arch == "llama" else Qwen2Config(**causal)


def make_tiny_model(directory: str | Path, arch: Arch = "llama", *, seed: int = 0) -> Path:
    """Build a randomly initialised 2-layer, hidden-64 model and its tokenizer in `directory`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    if arch not in ARCHS:
        raise ValueError(f"unknown arch '{arch}'; choose one of {', '.join(ARCHS)}")
    if arch in VISION_ARCHS:
        return make_tiny_vision_model(directory, arch, seed=seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(arch)
    torch.manual_seed(seed)
    config = _config(arch, tokenizer)
    factory = AutoModelForMaskedLM if arch == "bert" else AutoModelForCausalLM
    model = factory.from_config(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
