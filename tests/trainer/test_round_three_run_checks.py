"""Catalog round three at run time on the tiny models: G012 (EOS masked as padding, a script's own
collator) and G014 (the adapter a save wrote does not hold what was trained)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

from flightdeck.worker.callback import FlightdeckCallback, HealthStop
from flightdeck.worker.train.adapter_save_check import adapter_save_problems
from flightdeck.worker.train.collate import CausalLMCollator
from flightdeck.worker.train.eos_supervision import rows_with_masked_eos
from flightdeck.worker.train.metrics_file import read_metrics

from .conftest import RunOutcome

TEXTS = [f"Question: what is {a} plus {a + 3}? Answer: {2 * a + 3}" for a in range(24)]


@pytest.fixture(autouse=True)
def _outside_flightdeck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLIGHTDECK_RUN_DIR", raising=False)


def _lora(workspace: Path, **config: Any) -> tuple[Any, Any]:
    tokenizer = AutoTokenizer.from_pretrained(workspace / "models/tiny-llama")
    model = AutoModelForCausalLM.from_pretrained(workspace / "models/tiny-llama", dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, **config)
    return tokenizer, get_peft_model(model, lora)


def _args(tmp_path: Path, **kw: Any) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        **({"max_steps": 1, "save_strategy": "no"} | kw),
    )


def _events(path: Path, code: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_metrics(path) if r["type"] == "event" and (code is None or r["code"] == code)]


# --- G012 ---------------------------------------------------------------------------------------


def _eos_script_trainer(workspace: Path, tmp_path: Path, *, pad_is_eos: bool) -> tuple[Trainer, Path]:
    """The set-up of trl#1623 / llm-course#33: text + eos, `pad_token = eos_token`, the LM collator."""
    tokenizer, model = _lora(workspace)
    if pad_is_eos:
        tokenizer.pad_token = tokenizer.eos_token
    rows = [tokenizer(text + tokenizer.eos_token) for text in TEXTS]
    metrics = tmp_path / "metrics.jsonl"
    trainer = Trainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=rows,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        processing_class=tokenizer,
        callbacks=[FlightdeckCallback(metrics)],
    )
    return trainer, metrics


def test_g012_a_script_padding_with_eos_through_the_lm_collator_is_told(
    workspace: Path, tmp_path: Path
) -> None:
    trainer, metrics = _eos_script_trainer(workspace, tmp_path, pad_is_eos=True)
    trainer.train()
    g012 = _events(metrics, "G012")
    assert len(g012) == 1 and g012[0]["severity"] == "warn"
    assert (
        "never learns to stop" in g012[0]["message"]
        and "DataCollatorForLanguageModeling" in g012[0]["message"]
    )
    assert "4 of 4 sample rows" in g012[0]["message"] and "pad_token" in g012[0]["fix"]


def test_g012_a_distinct_pad_token_raises_nothing(workspace: Path, tmp_path: Path) -> None:
    trainer, metrics = _eos_script_trainer(workspace, tmp_path, pad_is_eos=False)
    trainer.train()
    assert _events(metrics, "G012") == []


def test_g012_the_trainers_collator_keeps_eos_supervised_when_pad_is_eos(workspace: Path) -> None:
    """Recipe jobs: the trainer pads labels by position, so pad == EOS still trains the stop."""
    tokenizer = AutoTokenizer.from_pretrained(workspace / "models/tiny-llama")
    tokenizer.pad_token = tokenizer.eos_token
    collator = CausalLMCollator(
        tokenizer, prompt_template="Question: {question}\nAnswer: ", max_seq_length=64
    )
    batch = collator(
        [{"question": "what is 2 plus 2?", "answer": "4"}, {"question": "q", "answer": "a longer answer"}]
    )
    assert rows_with_masked_eos(batch, tokenizer.eos_token_id) == []
    eos_labels = (batch["labels"] == tokenizer.eos_token_id).sum(dim=1)
    assert eos_labels.tolist() == [1, 1]


# --- G014 ---------------------------------------------------------------------------------------


def test_g014_a_head_trained_outside_the_adapter_stops_at_the_first_save(
    workspace: Path, tmp_path: Path
) -> None:
    tokenizer, model = _lora(workspace)
    model.base_model.model.lm_head.weight.requires_grad_(True)  # unfrozen by hand, not modules_to_save
    rows = [tokenizer(text) for text in TEXTS]
    metrics = tmp_path / "metrics.jsonl"
    trainer = Trainer(
        model=model,
        args=_args(tmp_path, max_steps=3, save_strategy="steps", save_steps=1),
        train_dataset=rows,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[FlightdeckCallback(metrics)],
    )
    with pytest.raises(HealthStop) as stop:
        trainer.train()
    event = stop.value.event
    assert event.code == "G014" and event.step == 1 and "checkpoint-1" in event.message
    assert "outside the adapter are not saved" in event.message and "lm_head.weight" in event.message
    assert "modules_to_save" in (event.fix or "")
    assert [e["code"] for e in _events(metrics, "G014")] == ["G014"]


def test_g014_a_healthy_save_is_verified(workspace: Path, tmp_path: Path) -> None:
    tokenizer, model = _lora(workspace, modules_to_save=["lm_head"])
    metrics = tmp_path / "metrics.jsonl"
    Trainer(
        model=model,
        args=_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=1),
        train_dataset=[tokenizer(text) for text in TEXTS],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[FlightdeckCallback(metrics)],
    ).train()
    verified = [e for e in _events(metrics) if "verified" in e["message"]]
    assert [e["step"] for e in verified] == [1, 2] and verified[0]["data"]["tensors"] == 9
    assert _events(metrics, "G014") == []


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda t: torch.empty(0), "saved with another shape"),  # ZeRO-3 without gathering: 0-sized
        (lambda t: torch.zeros_like(t), "saved all zero though trained non-zero"),  # FSDP shard not gathered
        (None, "missing from the file"),
    ],
    ids=["zero-sized", "all-zero", "missing"],
)
def test_g014_files_written_the_way_sharded_saves_break_them(
    workspace: Path, tmp_path: Path, damage: Callable[[torch.Tensor], torch.Tensor] | None, expected: str
) -> None:
    _, model = _lora(workspace)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()  # as after training: lora_B leaves its zero start
    model.save_pretrained(tmp_path)
    file = tmp_path / "adapter_model.safetensors"
    tensors = load_file(str(file))
    key = next(k for k in tensors if "lora_B" in k)
    if damage is None:
        del tensors[key]
    else:
        tensors[key] = damage(tensors[key]).contiguous()
    save_file(tensors, str(file))
    problems, checked = adapter_save_problems(model, tmp_path)
    assert checked == 8 and len(problems) == 1 and expected in problems[0] and key in problems[0]


@pytest.mark.slow  # a recipe run under torchrun
def test_g014_recipe_runs_verify_each_checkpoint_and_the_output(
    run_trainer: Callable[..., RunOutcome], make_recipe: Callable[..., dict[str, Any]]
) -> None:
    recipe = make_recipe(training={"max_steps": 2, "save_steps": 1}, resources={"gpus_per_node": 1})
    outcome = run_trainer(recipe, nproc=1)
    assert outcome.returncode == 0, outcome.describe()
    verified = [e["message"] for e in outcome.events if "verified" in e["message"]]
    assert [m.split(" verified")[0] for m in verified] == [
        "adapter save in checkpoint-1",
        "adapter save in checkpoint-2",
        "adapter save in stage-0",
    ], outcome.describe()
    # H006's fallback: the rank registered its faulthandler dumps (the agent may send SIGUSR1 to it).
    assert (outcome.run_dir / "stacks" / "rank-0.txt").is_file()


# --- G015 (script jobs) -------------------------------------------------------------------------


class OwnCausalLM(torch.nn.Module):
    """A team's own wrapper, as scripts write them: a named forward, no **kwargs for the Trainer."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: Any, attention_mask: Any = None, labels: Any = None) -> Any:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


@pytest.mark.parametrize(
    "own_forward, accumulation, warned", [(True, 2, True), (True, 1, False), (False, 2, False)]
)
def test_g015_a_scripts_forward_without_loss_kwargs_under_accumulation_is_told(
    workspace: Path, tmp_path: Path, own_forward: bool, accumulation: int, warned: bool
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(workspace / "models/tiny-llama")
    inner = AutoModelForCausalLM.from_pretrained(workspace / "models/tiny-llama", dtype=torch.float32)
    model = OwnCausalLM(inner) if own_forward else inner
    metrics = tmp_path / "metrics.jsonl"
    Trainer(
        model=model,
        args=_args(tmp_path, gradient_accumulation_steps=accumulation, remove_unused_columns=False),
        train_dataset=[tokenizer(text) for text in TEXTS],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[FlightdeckCallback(metrics)],
    ).train()
    g015 = _events(metrics, "G015")
    assert len(g015) == int(warned)
    if warned:
        assert (
            "OwnCausalLM.forward takes no loss kwargs" in g015[0]["message"]
            and "num_items_in_batch" in g015[0]["fix"]
        )
