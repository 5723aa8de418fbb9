"""Tiny vision-language models built from config: Qwen2-VL, Qwen2.5-VL and LLaVA with a SigLIP tower.

Random weights, a BPE tokenizer with the family's special tokens and chat template, and the image
processor saved beside them, so `from_pretrained` on the directory gives model + tokenizer + image
processor offline. The `*ImageProcessorPil` processors need only pillow (no torchvision).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flightdeck.worker.tiny.tokenizer import train_tokenizer

# ChatML with Qwen2-VL's vision markers: an image content part becomes one placeholder.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# LLaVA-1.5's USER/ASSISTANT format.
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %} "
    "{% else %}ASSISTANT: {% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
QWEN2_VL_SPECIALS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen2-VL's images in the demo data are 56x56: one 4x4 patch grid merged 2x2 -> 4 image tokens.
QWEN2_VL_PIXELS = 56 * 56
LLAVA_IMAGE_SIZE = 32
_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


def _qwen2_vl(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import Qwen2VLConfig, Qwen2VLImageProcessorPil

    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in QWEN2_VL_SPECIALS}
    text = _TEXT | {
        "vocab_size": len(tokenizer),
        # M-RoPE splits head_dim/2 = 8 rotary frequencies over (time, height, width).
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"],
    }
    vision = {
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": _TEXT["hidden_size"],  # the merger projects into the language model's width
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    processor = Qwen2VLImageProcessorPil(min_pixels=QWEN2_VL_PIXELS, max_pixels=QWEN2_VL_PIXELS)
    return config, processor


def _qwen2_5_vl(tokenizer: Any) -> tuple[Any, Any]:
    """Qwen2.5-VL: Qwen2-VL's tokens and processor; a windowed tower (one full-attention block) whose
    merger projects to the language model's width (out_hidden_size)."""
    from transformers import Qwen2_5_VLConfig

    qwen2, processor = _qwen2_vl(tokenizer)
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "out_hidden_size": _TEXT["hidden_size"],
    }
    config = Qwen2_5_VLConfig(
        text_config=qwen2.text_config.to_dict(),
        vision_config=vision,
        image_token_id=qwen2.image_token_id,
        video_token_id=qwen2.video_token_id,
        vision_start_token_id=qwen2.vision_start_token_id,
        vision_end_token_id=qwen2.vision_end_token_id,
        bos_token_id=None,
        eos_token_id=qwen2.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return config, processor


def _llava_siglip(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlavaConfig, SiglipImageProcessorPil, SiglipVisionConfig

    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=LLAVA_IMAGE_SIZE,
        patch_size=8,
    )
    text = LlamaConfig(
        **_TEXT,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        # SigLIP has no CLS token: the default strategy would drop a real patch (token/feature mismatch).
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    size = {"height": LLAVA_IMAGE_SIZE, "width": LLAVA_IMAGE_SIZE}
    return config, SiglipImageProcessorPil(size=size)


VISION_ARCHS = {"qwen2_vl": _qwen2_vl, "qwen2_5_vl": _qwen2_5_vl, "llava_siglip": _llava_siglip}


def make_tiny_vision_model(directory: str | Path, arch: str, *, seed: int = 0) -> Path:
    """Write a randomly initialised tiny `arch` (qwen2_vl, qwen2_5_vl, llava_siglip) model to `directory`."""
    import torch
    from transformers import AutoModelForImageTextToText

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if arch in ("qwen2_vl", "qwen2_5_vl"):
        tokenizer = train_tokenizer(extra_specials=QWEN2_VL_SPECIALS, bos=False)
        tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    else:
        tokenizer = train_tokenizer(extra_specials=("<image>",), bos=True)
        tokenizer.chat_template = LLAVA_CHAT_TEMPLATE
    config, image_processor = VISION_ARCHS[arch](tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    image_processor.save_pretrained(out)
    return out
