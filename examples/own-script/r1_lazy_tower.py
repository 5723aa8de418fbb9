"""R1's failure, reproduced the way it happened: the model's own code freezes its vision tower after
the LoRA adapters were added.

A LLaVA-style model (SigLIP tower + language model) gets LoRA on q_proj/v_proj, which both the tower
and the language model have. The tower "loads its weights lazily" on its first forward and, as R1's
tower did, calls requires_grad_(False) on itself then: the adapters inside it freeze with it. The loss
still falls (the language model's adapters learn), so nothing looks wrong; under Flightdeck the run
stops in its first steps with G002, naming the tower's dead adapter tensors.

    flightdeck make-tiny-model models/tiny-llava-siglip --arch llava_siglip
    examples/own-script/r1-lazy-tower-job.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForImageTextToText, AutoTokenizer, Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PromptAnswerDataset, arithmetic_texts, pad_batch, training_arguments

from flightdeck.callback import FlightdeckCallback


def load_tower_weights_once(tower: torch.nn.Module, _inputs: object) -> None:
    """The tower's lazy loading, as in R1: it loads its pretrained weights on first use and freezes
    itself, adapters included, long after get_peft_model ran."""
    if not getattr(tower, "weights_loaded", False):
        tower.requires_grad_(False)
        tower.weights_loaded = True


class ImageQuestions(PromptAnswerDataset):
    """Arithmetic questions, each after one image's placeholder tokens (synthetic pixels)."""

    def __init__(self, tokenizer, config, pairs):  # type: ignore[no-untyped-def]
        vision = config.vision_config
        tokens = (vision.image_size // vision.patch_size) ** 2
        super().__init__(tokenizer, pairs, prefix=[config.image_token_index] * tokens)
        generator = torch.Generator().manual_seed(0)
        for item in self.items:
            item["pixel_values"] = torch.rand(3, vision.image_size, vision.image_size, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/tiny-llava-siglip")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--metrics", default=None)
    options = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(options.model)
    model = AutoModelForImageTextToText.from_pretrained(options.model, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    model.base_model.model.model.vision_tower.register_forward_pre_hook(load_tower_weights_once)
    args = training_arguments("runs/r1-lazy-tower-output", options.max_steps, 1e-2)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=ImageQuestions(tokenizer, model.config, arithmetic_texts(200)),
        data_collator=pad_batch(tokenizer.pad_token_id or 0),
        callbacks=[FlightdeckCallback(options.metrics)],
    )
    trainer.train()


if __name__ == "__main__":
    main()
