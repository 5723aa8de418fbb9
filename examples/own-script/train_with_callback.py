"""Your own HF Trainer script, with `callbacks=[FlightdeckCallback()]` written in.

LoRA on a causal LM with the team's own data code. Under Flightdeck (examples/own-script/callback-job.json)
every step's loss, grad norm and adapter grad norm reach the service and the health checks can stop
the run. A script job needs no such line (instrumentation gives every Trainer the callback, once, and
this one keeps its own); it is written in here so that the script, run alone, keeps the same records
with `--metrics metrics.jsonl`:

    python examples/own-script/train_with_callback.py --model models/tiny-llama --metrics /tmp/m.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file

from common import PromptAnswerDataset, arithmetic_texts, pad_batch, training_arguments

from flightdeck.callback import FlightdeckCallback


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/tiny-llama")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--metrics", default=None, help="metrics.jsonl outside Flightdeck")
    options = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(options.model)
    model = AutoModelForCausalLM.from_pretrained(options.model, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    args = training_arguments("runs/own-script-output", options.max_steps, options.learning_rate)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=PromptAnswerDataset(tokenizer, arithmetic_texts(400)),
        data_collator=pad_batch(tokenizer.pad_token_id or 0),
        callbacks=[FlightdeckCallback(options.metrics)],  # also outside Flightdeck (--metrics)
    )
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
