"""Real torchrun (2 ranks, gloo) over data as users have it: a Hub snapshot, save_to_disk output, chat
and TRL prompt-completion data in one recipe, loaded through `datasets` and handed to spawned DataLoader
workers; a streamed corpus."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import RunOutcome

pytestmark = pytest.mark.slow  # real torchrun; ~30 s each on 2 cores

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _chat_model(workspace: Path, tmp_path: Path) -> Path:
    from transformers import AutoTokenizer

    model = tmp_path / "tiny-llama-chat"
    shutil.copytree(workspace / "models" / "tiny-llama", model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(model)
    return model


def test_hub_snapshot_save_to_disk_and_chat_data_train_under_ddp(
    workspace: Path,
    tmp_path: Path,
    make_recipe: Callable[..., dict[str, Any]],
    run_trainer: Callable[..., RunOutcome],
) -> None:
    from datasets import Dataset, DatasetDict

    rows = json.loads((workspace / "data" / "alpaca.json").read_text())
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(tmp_path / "alpaca-saved")
    turns = [
        {"role": "system", "content": "You read charts."},
        {"role": "user", "content": "What is the value of bar 3?"},
        {"role": "assistant", "content": "42"},
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"messages": turns}) + "\n" for _ in range(32)))
    # TRL's prompt-completion shapes: text rows, and turns saved by `datasets` (Arrow lists of structs).
    text_rows = [{"prompt": "What is the value of bar 3?", "completion": " 42"}] * 8
    (tmp_path / "pc.jsonl").write_text("".join(json.dumps(row) + "\n" for row in text_rows))
    Dataset.from_list([{"prompt": turns[:2], "completion": turns[2:]}] * 8).to_parquet(
        str(tmp_path / "pc.parquet")
    )
    recipe = make_recipe(
        model={"path": str(_chat_model(workspace, tmp_path))},
        data={
            "train": [
                {"path": "data/chartqa", "preset": "chartqa", "split": "train"},  # data/train-0000x-of-0000y
                {"path": str(tmp_path / "alpaca-saved"), "preset": "alpaca"},
                {"path": str(tmp_path / "chat.jsonl"), "preset": "messages"},
                {"path": str(tmp_path / "pc.jsonl"), "preset": "prompt_completion"},
                {"path": str(tmp_path / "pc.parquet"), "preset": "prompt_completion"},
            ],
            "num_workers": 1,  # the datasets pickle to a spawned loader worker in each rank
        },
        training={"max_steps": 3},
    )
    outcome = run_trainer(recipe, nproc=2)
    assert outcome.returncode == 0, outcome.describe()
    assert [s["step"] for s in outcome.steps] == [1, 2, 3]
    assert all(s["loss"] == s["loss"] and s["loss"] > 0 for s in outcome.steps)  # finite, supervised
    # 200 ChartQA + 100 Alpaca + 32 chat + 8 + 8 prompt-completion, in every rank
    assert "dataset has 348 samples" in outcome.output
    pickled = [e for e in outcome.events if (e.get("data") or {}).get("pickled_bytes")]
    assert pickled and pickled[0]["data"]["pickled_bytes"] < 50_000  # file references, not the rows


def test_a_streamed_corpus_trains_masked_lm_under_ddp(
    workspace: Path,
    tmp_path: Path,
    make_recipe: Callable[..., dict[str, Any]],
    run_trainer: Callable[..., RunOutcome],
) -> None:
    recipe = make_recipe(
        task="masked_lm",
        model={"path": "models/tiny-bert"},
        adapter=None,
        data={"train": [{"path": "data/corpus.txt", "preset": "text", "streaming": True}], "num_workers": 0},
        training={"max_steps": 3},
    )
    outcome = run_trainer(recipe, nproc=2)
    assert outcome.returncode == 0, outcome.describe()
    assert [s["step"] for s in outcome.steps] == [1, 2, 3]
    assert "dataset has a stream" in outcome.output
