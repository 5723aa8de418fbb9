"""The field-report set-ups (docs/failures.md) in miniature, each a real `torchrun --nproc_per_node 2` run on CPU."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from flightdeck.worker.tiny.demo_data import corpus_lines
from flightdeck.worker.train.result import HEALTH_EXIT_CODE

pytestmark = pytest.mark.slow  # each test is a real torchrun; ~10-30 s on 2 cores


def _health_exit(outcome) -> bool:  # type: ignore[no-untyped-def]
    # torchrun itself exits 1 when its ranks fail; the ranks' own code is in its summary.
    return f"exitcode  : {HEALTH_EXIT_CODE}" in outcome.output and outcome.returncode != 0


def test_r1_lora_with_frozen_submodule_learns_under_ddp(run_trainer, make_recipe):
    # Layer 0 (the "vision tower") is frozen before PEFT although it holds q/v targets: the R1 fix
    # must keep its adapters trainable.
    recipe = make_recipe(
        model={"freeze": [r"^model\.layers\.0\."]},
        training={"max_steps": 30, "learning_rate": 0.01},
    )
    outcome = run_trainer(recipe)
    assert outcome.returncode == 0, outcome.describe()
    assert outcome.result and outcome.result["status"] == "succeeded"
    assert Path(outcome.result["output_path"], "adapter_model.safetensors").exists()
    steps = outcome.steps
    assert [s["step"] for s in steps] == list(range(1, 31))
    assert all(s["adapter_grad_norm"] > 0 for s in steps[1:]), [s["adapter_grad_norm"] for s in steps]
    assert (
        statistics.mean(s["loss"] for s in steps[-5:]) < statistics.mean(s["loss"] for s in steps[:5]) - 0.1
    )
    start = next(e for e in outcome.events if "wrapper" in (e.get("data") or {}))  # "training started"
    assert start["data"]["wrapper"] == "DistributedDataParallel"
    # 8 adapter tensors (2 layers x q,v x A,B), all trainable, layer 0's included:
    # per layer q: A 8x64 + B 64x8, v (2 kv heads x 16 = 32 wide): A 8x64 + B 32x8.
    assert start["data"]["adapter_tensors"] == 8
    assert steps[0]["trainable_params"] == 2 * ((8 * 64 + 64 * 8) + (8 * 64 + 32 * 8))
    for rank in (0, 1):
        assert f"rank {rank}: stage 1 dataset has" in outcome.output
    assert _ends_said(outcome.run_dir) == {0: 0, 1: 0}  # what's left is teardown (the agent's H008 watch)


def _ends_said(run_dir: Path) -> dict[int, int]:
    """Each rank's end marker: the code it said it exits with."""
    said = (json.loads(p.read_text()) for p in run_dir.glob("script-end-rank*.json"))
    return {m["rank"]: m["exit_code"] for m in said}


def test_r1_failure_freezing_the_adapters_stops_with_g001(run_trainer, make_recipe):
    outcome = run_trainer(make_recipe(model={"freeze": ["lora_"]}))
    assert _health_exit(outcome), outcome.describe()
    assert outcome.result == {
        "status": "failed",
        "failure_code": "G001",
        "message": outcome.result["message"],
        "fix": outcome.result["fix"],
        "output_path": None,
    }
    assert "'lora_'" in outcome.result["fix"] and "model.freeze" in outcome.result["fix"]
    assert not outcome.steps  # stopped before step 1
    assert outcome.events[-1]["code"] == "G001" and outcome.events[-1]["severity"] == "fatal"
    # A hang leaving the group now ends as this health stop, not as a success or never (H008).
    assert _ends_said(outcome.run_dir) == {0: HEALTH_EXIT_CODE, 1: HEALTH_EXIT_CODE}


def test_huge_learning_rate_stops_with_h001(run_trainer, make_recipe):
    # Full fine-tune, plain SGD at lr 10, no clipping: the weights blow up within a few steps.
    recipe = make_recipe(
        adapter=None,
        training={"learning_rate": 10.0, "max_grad_norm": None, "max_steps": 20, "optimizer": "sgd"},
        health={"nonfinite_patience": 1, "grad_norm_limit": 1e12},
    )
    outcome = run_trainer(recipe)
    assert _health_exit(outcome), outcome.describe()
    assert outcome.result and outcome.result["failure_code"] == "H001"
    last = outcome.steps[-1]
    assert last["loss"] in ("NaN", "Infinity") or last["grad_norm"] in ("NaN", "Infinity")
    assert len(outcome.steps) < 20


def test_r2_full_finetune_then_lora_on_4bit_load_of_stage_one(run_trainer, make_recipe):
    frozen_but_layer_1 = [r"^model\.embed_tokens", r"^model\.layers\.0\.", r"^model\.norm", r"^lm_head"]
    recipe = make_recipe(
        adapter=None,
        model={"freeze": frozen_but_layer_1},
        training={"max_steps": 4, "learning_rate": 1e-3},
        stages=[
            {"adapter": None, "model": {"freeze": frozen_but_layer_1}},
            {
                "model": {"path": "@previous", "quantization": "4bit", "freeze": []},
                "adapter": {
                    "type": "lora",
                    "r": 8,
                    "alpha": 16,
                    "dropout": 0.0,
                    "target_modules": ["q_proj", "v_proj"],
                },
            },
        ],
    )
    outcome = run_trainer(recipe)
    assert outcome.returncode == 0, outcome.describe()
    starts = [e for e in outcome.events if "wrapper" in (e.get("data") or {})]
    assert [s["data"]["wrapper"] for s in starts] == ["DistributedDataParallel", "DistributedDataParallel"]
    # The start line says over how many processes DDP runs (a one-process run: "a group of one").
    assert all("DistributedDataParallel over 2 processes" in s["message"] for s in starts), [
        s["message"] for s in starts
    ]
    # Stage 1 trains layer 1 only; stage 2 only the adapters.
    assert starts[0]["data"]["adapter_tensors"] == 0 and starts[1]["data"]["adapter_tensors"] == 8
    assert starts[0]["data"]["quantized_tensors"] == 0 and starts[1]["data"]["quantized_tensors"] > 0
    assert [s["step"] for s in outcome.steps] == list(range(1, 9))
    assert [s["stage"] for s in outcome.steps] == [0] * 4 + [1] * 4
    assert not [e for e in outcome.events if e["code"] == "P002"]
    stage_1 = outcome.run_dir / "output" / "stage-0"
    assert (stage_1 / "model.safetensors").exists()
    assert outcome.result["output_path"] == str(outcome.run_dir / "output" / "stage-1")


def test_r3_masked_lm_large_corpus_two_ranks_two_workers(run_trainer, make_recipe, workspace):
    corpus = workspace / "data" / "corpus-20k.txt"
    corpus.write_text("\n".join(corpus_lines(20_000, seed=3)) + "\n")
    recipe = make_recipe(
        task="masked_lm",
        model={"path": "models/tiny-bert", "gradient_checkpointing": False},
        adapter=None,
        data={"train": [{"path": "data/corpus-20k.txt", "preset": "text"}], "num_workers": 2},
        training={"per_device_batch_size": 8, "max_steps": 4, "learning_rate": 1e-3},
    )
    outcome = run_trainer(recipe)
    assert outcome.returncode == 0, outcome.describe()
    for rank in (0, 1):
        assert f"rank {rank}: stage 1 dataset has 20000 samples" in outcome.output
    assert "D004" not in outcome.output  # the collators raise D004 on an empty example
    # What each of the 2 x 2 loader workers received: a path and offsets, not the 20,000 lines (R3).
    (pickled,) = [e for e in outcome.events if "pickled_bytes" in (e.get("data") or {})]
    assert pickled["data"]["samples"] == 20_000 and pickled["data"]["pickled_bytes"] < 4_000
    assert len(outcome.steps) == 4 and all(isinstance(s["loss"], float) for s in outcome.steps)


def test_r4_lora_r128_checkpointing_accumulation_16_on_qwen2(run_trainer, make_recipe):
    recipe = make_recipe(
        model={"path": "models/tiny-qwen2", "gradient_checkpointing": True},
        adapter={"r": 128, "alpha": 256, "target_modules": "all-linear"},
        training={"per_device_batch_size": 1, "gradient_accumulation_steps": 16, "max_steps": 3},
        resources={"gpus_per_node": 1},
    )
    outcome = run_trainer(recipe, nproc=1)
    assert outcome.returncode == 0, outcome.describe()
    assert [s["step"] for s in outcome.steps] == [1, 2, 3]
    assert all(s["adapter_grad_norm"] > 0 for s in outcome.steps[1:])
    # 16 micro-batches of 1 sample per optimizer step.
    last = outcome.steps[-1]
    assert last["samples_per_second"] * last["step_time"] == pytest.approx(16)


def test_data_eval_is_evaluated_and_its_loss_streamed(run_trainer, make_recipe):
    recipe = make_recipe(
        data={"eval": [{"path": "data/chartqa", "preset": "chartqa", "split": "val"}]},
        training={"max_steps": 5, "eval_steps": 2},
    )
    outcome = run_trainer(recipe)
    assert outcome.returncode == 0, outcome.describe()
    evals = [s for s in outcome.steps if "eval_loss" in s]
    assert [s["step"] for s in evals] == [2, 4, 5]  # every eval_steps, and the final model once
    assert all(isinstance(s["eval_loss"], float) and s["eval_loss"] > 0 for s in evals)
    # One record per step: a reader whose cursor passed step 4 never misses its eval loss.
    assert all(isinstance(s["loss"], float) for s in evals) and len(outcome.steps) == 5


def test_evaluation_keeps_losses_never_logits(make_recipe, tmp_path):
    from flightdeck.recipe import parse_recipe
    from flightdeck.worker.train.recipe_run import training_arguments

    recipe = parse_recipe(make_recipe(data={"eval": [{"path": "data/chartqa", "split": "val"}]}))
    assert training_arguments(recipe, tmp_path, use_cpu=True, distributed=False).prediction_loss_only


def test_a_recipe_the_trainer_refuses_names_every_problem_and_hides_torchruns_report(
    run_trainer, make_recipe
):
    """Regression: R2's example failed as 'exit:1: torchrun exited with code 1' + torchrun's Root Cause
    block, and result.json said only 'RecipeInvalid: 2 problem(s)'."""
    from flightdeck.worker.agent.classify import classify_exit

    recipe = make_recipe(
        stages=[{"env": {"TOKENIZERS_PARALLELISM": "false"}}, {"model": {"path": "@previous"}}]
    )
    outcome = run_trainer(recipe, nproc=1)
    assert outcome.returncode != 0
    assert outcome.result is not None and "stages[0].env" in outcome.result["message"]
    assert [f["path"] for f in outcome.result["findings"]] == ["stages[0].env"]
    failure = classify_exit(outcome.returncode, outcome.result, outcome.output)
    assert "stages[0].env" in failure.message and "set env at the top level" in failure.message
    assert "Root Cause" not in failure.message and "error_file" not in failure.message
    assert "Root Cause" in outcome.output  # torchrun did print it; the log tail keeps it
    # The attempt keeps the trainer's findings, and the job's failure says what to change.
    assert [f["path"] for f in failure.report()["findings"]] == ["stages[0].env"]
    assert failure.fix and "set env at the top level" in failure.fix


def test_h001_sees_the_real_nan_loss_not_a_running_average(run_trainer, make_recipe):
    """Every label masked (prompts longer than max_seq_length; host preflight would say D005): the loss
    is NaN from step 1. The Trainer's NaN filter would log it as 'loss 0.0, grad_norm nan'."""
    recipe = make_recipe(data={"max_seq_length": 8}, health={"nonfinite_patience": 1})
    outcome = run_trainer(recipe, nproc=1)
    assert _health_exit(outcome), outcome.describe()
    assert outcome.result and outcome.result["failure_code"] == "H001"
    assert outcome.steps[0]["loss"] == "NaN"
