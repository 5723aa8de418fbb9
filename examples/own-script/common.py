"""Small helpers the example scripts share: a learnable arithmetic dataset and where outputs go.

A team's own script would have its own; these only keep the examples short.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch


def output_dir(default: str) -> str:
    """Under Flightdeck the run directory (FLIGHTDECK_RUN_DIR), so outputs land beside the logs."""
    run_dir = os.environ.get("FLIGHTDECK_RUN_DIR")
    return str(Path(run_dir) / "output") if run_dir else default


def training_arguments(default_output: str, max_steps: int, learning_rate: float) -> Any:
    """A team's usual TrainingArguments: CPU + gloo where there is no GPU, one log line per step."""
    from transformers import TrainingArguments

    cpu = not torch.cuda.is_available()
    return TrainingArguments(
        output_dir=output_dir(default_output),
        per_device_train_batch_size=4,
        max_steps=max_steps,
        learning_rate=learning_rate,
        logging_steps=1,  # the health checks judge every logged step
        save_strategy="no",
        report_to="none",
        use_cpu=cpu,
        ddp_backend="gloo" if cpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        remove_unused_columns=False,
        disable_tqdm=True,
    )


def arithmetic_texts(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, answer) pairs a tiny model learns within a few dozen steps."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        pairs.append((f"Question: what is {a} plus {b}? Answer: ", str(a + b)))
    return pairs


class PromptAnswerDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Tokenised prompt + answer; only the answer (and EOS) is supervised."""

    def __init__(self, tokenizer: Any, pairs: list[tuple[str, str]], prefix: list[int] | None = None):
        self.items = []
        for prompt, answer in pairs:
            prompt_ids = (prefix or []) + tokenizer(prompt, add_special_tokens=False)["input_ids"]
            answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            self.items.append(
                {
                    "input_ids": prompt_ids + answer_ids,
                    "labels": [-100] * len(prompt_ids) + answer_ids,
                }
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.items[index]


def pad_batch(pad_id: int):  # type: ignore[no-untyped-def]
    """A collate function padding input_ids/labels on the right, with the attention mask."""

    def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(r["input_ids"]) for r in rows)
        batch: dict[str, list[Any]] = {"input_ids": [], "labels": [], "attention_mask": []}
        for row in rows:
            pad = longest - len(row["input_ids"])
            batch["input_ids"].append(row["input_ids"] + [pad_id] * pad)
            batch["labels"].append(row["labels"] + [-100] * pad)
            batch["attention_mask"].append([1] * len(row["input_ids"]) + [0] * pad)
        out = {key: torch.tensor(value) for key, value in batch.items()}
        for key in ("pixel_values",):
            if key in rows[0]:
                out[key] = torch.stack([r[key] for r in rows])
        return out

    return collate
