"""Your own HF Trainer script under Flightdeck: one added line, `callbacks=[FlightdeckCallback()]`.

LoRA on a causal LM with the team's own data code. Under Flightdeck (examples/own-script/callback-job.json)
every step's loss, grad norm and adapter grad norm reach the service and the health checks can stop
the run; alone, `--metrics metrics.jsonl` keeps the same records:

    python examples/own-script/train_with_callback.py --model models/tiny-llama --metrics /tmp/m.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file

from common import PromptAnswerDataset, arithmetic_texts, output_dir, pad_batch

from worker.callback import FlightdeckCallback


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
    cpu = not torch.cuda.is_available()
    args = TrainingArguments(
        output_dir=output_dir("runs/own-script-output"),
        per_device_train_batch_size=4,
        max_steps=options.max_steps,
        learning_rate=options.learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=cpu,
        ddp_backend="gloo" if cpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=PromptAnswerDataset(tokenizer, arithmetic_texts(400)),
        data_collator=pad_batch(tokenizer.pad_token_id or 0),
        callbacks=[FlightdeckCallback(options.metrics)],  # the one line Flightdeck needs
    )
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
