"""Fine-tune a causal LM on question/answer pairs with the HF Trainer (a team's own script).

    torchrun --nproc_per_node 2 train_qa.py --model_name_or_path models/tiny-llama \
        --train_file data/qa.jsonl --output_dir out --max_steps 20 --use_cpu --ddp_backend gloo

Only the answer is supervised: prompt tokens get label -100.
"""

import json
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class DataArguments:
    model_name_or_path: str = field(metadata={"help": "model directory"})
    train_file: str = field(metadata={"help": "jsonl with question and answer"})
    max_seq_length: int = field(default=64)


class QADataset(torch.utils.data.Dataset):
    def __init__(self, path, tokenizer, max_len):
        with open(path) as f:
            self.rows = [json.loads(line) for line in f if line.strip()]
        self.tokenizer = tokenizer
        self.max_len = max_len

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        prompt = self.tokenizer(f"Question: {row['question']}\nAnswer: ")["input_ids"]
        answer = self.tokenizer(row["answer"], add_special_tokens=False)["input_ids"]
        ids = (prompt + answer)[: self.max_len]
        labels = ([-100] * len(prompt) + answer)[: self.max_len]
        return {"input_ids": ids, "labels": labels}


def collate(batch):
    width = max(len(x["input_ids"]) for x in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    labels = torch.full((len(batch), width), -100)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for i, x in enumerate(batch):
        n = len(x["input_ids"])
        ids[i, :n] = torch.tensor(x["input_ids"])
        labels[i, :n] = torch.tensor(x["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def main():
    data_args, training_args = HfArgumentParser(
        (DataArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(data_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(data_args.model_name_or_path, dtype=torch.float32)
    training_args.remove_unused_columns = False
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=QADataset(data_args.train_file, tokenizer, data_args.max_seq_length),
        data_collator=collate,
    )
    trainer.train()
    trainer.save_model()
    print("done")


if __name__ == "__main__":
    main()
