"""D004 at train begin (R3): a dataset whose pickled copy, what a spawned loader worker receives, is empty."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

from flightdeck.worker.callback import FlightdeckCallback, HealthStop
from flightdeck.worker.train.spawned_dataset import spawned_dataset_event

OWN_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "own-script"
sys.path.insert(0, str(OWN_SCRIPT))
from common import PromptAnswerDataset, arithmetic_texts, pad_batch  # noqa: E402


class SlimPickleDataset(PromptAnswerDataset):
    """R3's shape: the rows are left out of the pickle "to keep it small", to be reloaded lazily, never."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "items": []}


@pytest.fixture(autouse=True)
def _outside_flightdeck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLIGHTDECK_RUN_DIR", raising=False)


def _loader(dataset: Any, context: str | None) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
    return torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context=context)


def test_a_spawned_loader_whose_dataset_pickles_empty_is_d004_and_the_others_are_not(workspace: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(workspace / "models/tiny-llama")
    pairs = arithmetic_texts(16)
    event = spawned_dataset_event(_loader(SlimPickleDataset(tokenizer, pairs), "spawn"))
    assert event is not None and (event.code, event.severity) == ("D004", "fatal")
    assert "0 of 16 samples" in event.message and "SlimPickleDataset" in event.message
    assert spawned_dataset_event(_loader(PromptAnswerDataset(tokenizer, pairs), "spawn")) is None
    assert (
        spawned_dataset_event(_loader(SlimPickleDataset(tokenizer, pairs), "fork")) is None
    )  # nothing pickled
    in_process = torch.utils.data.DataLoader(SlimPickleDataset(tokenizer, pairs), num_workers=0)
    assert spawned_dataset_event(in_process) is None


def test_an_hf_trainer_with_spawned_workers_stops_at_train_begin_before_any_step(
    workspace: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(workspace / "models/tiny-llama")
    model = AutoModelForCausalLM.from_pretrained(workspace / "models/tiny-llama", dtype=torch.float32)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
        dataloader_num_workers=2,
        dataloader_multiprocessing_context="spawn",
    )
    metrics = tmp_path / "metrics.jsonl"
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=SlimPickleDataset(tokenizer, arithmetic_texts(32)),
        data_collator=pad_batch(0),
        callbacks=[FlightdeckCallback(str(metrics))],
    )
    with pytest.raises(HealthStop, match="D004"):
        trainer.train()
    assert trainer.state.global_step == 0
