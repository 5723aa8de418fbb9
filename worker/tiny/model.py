"""Tiny local models (llama, qwen2, bert; qwen2_vl, qwen2_5_vl, llava_siglip) with a BPE tokenizer trained
on the fly."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from worker.tiny.demo_data import corpus_lines
from worker.tiny.vision_model import VISION_ARCHS, make_tiny_vision_model

Arch = Literal["llama", "qwen2", "bert", "qwen2_vl", "qwen2_5_vl", "llava_siglip"]
ARCHS: tuple[Arch, ...] = ("llama", "qwen2", "bert", "qwen2_vl", "qwen2_5_vl", "llava_siglip")
_VOCAB_SIZE = 512
_DIGITS = " ".join(str(n) for n in range(100))


def train_tokenizer(arch: str = "llama", *, extra_specials: tuple[str, ...] = (), bos: bool = True):  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer, so any text encodes without unknown tokens; `extra_specials` are added
    as special tokens (a vision model's markers); `bos` prepends <s> to every encoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if arch == "bert":
        specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
        specials["mask_token"] = "[MASK]"
    else:
        specials = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    tokenizer = Tokenizer(models.BPE(unk_token=specials["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=list(specials.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [
        *corpus_lines(500, seed=1),
        _DIGITS,
        "Question: Answer: What Which value colour infographic chart",
    ]
    tokenizer.train_from_iterator(text, trainer=trainer)
    if arch == "bert":
        cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
    elif bos:
        bos_id = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", bos_id)]
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=512, **specials)
    if extra_specials:
        fast.add_special_tokens({"additional_special_tokens": list(extra_specials)})
    return fast


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
