"""A plain PyTorch loop (no HF Trainer) under Flightdeck: LoopMonitor, two calls per step.

Runs under torchrun as DDP (gloo on CPU, NCCL on GPUs) or alone:

    python examples/own-script/plain_loop.py --model models/tiny-llama --metrics /tmp/m.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PromptAnswerDataset, arithmetic_texts, pad_batch

from flightdeck.callback import LoopMonitor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/tiny-llama")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--metrics", default=None)
    options = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else None
    )
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(options.model)
    model = AutoModelForCausalLM.from_pretrained(options.model, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    model.train()  # from_pretrained returns eval mode
    if device is not None:
        model.to(device)
    if distributed:
        model = DistributedDataParallel(model, device_ids=[device.index] if device is not None else None)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    dataset = PromptAnswerDataset(tokenizer, arithmetic_texts(400))
    sampler = torch.utils.data.DistributedSampler(dataset) if distributed else None
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=4, sampler=sampler, shuffle=sampler is None, collate_fn=pad_batch(0)
    )

    monitor = LoopMonitor(model, optimizer, metrics_path=options.metrics)  # G001/G003/P002 now
    step = 0
    while step < options.max_steps:
        for batch in loader:
            if device is not None:
                batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss
            loss.backward()
            monitor.after_backward(loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            monitor.step()  # the step's record, and the health checks (HealthStop on a fatal one)
            optimizer.zero_grad()
            step += 1
            if step >= options.max_steps:
                break
    monitor.finish()
    if distributed:
        # Every rank leaves together: a rank tearing its process group down while another is still
        # on its way out was seen to leave that one waiting until the job was stopped.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
