"""A script job's well-known HF arguments feed the recipe rules and the memory estimate (issue 33).

The arguments are spelled the way TRL's `sft.py` and transformers' `run_clm.py` take them
(HfArgumentParser: `--x v`, `--x=v`, a bare `--bf16`).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from flightdeck.memory.reference_models import LLAMA2_7B
from flightdeck.preflight import run_static_preflight
from flightdeck.recipe import parse_recipe
from flightdeck.recipe.script_args import read_script_arguments
from tests.service.factories import USER

# What a user passes to TRL's sft.py for a full fine-tune of a 7B model (its README's example).
SFT_ARGS = [
    "--model_name_or_path", "{workspace}/models/llama-2-7b",
    "--dataset_name", "{workspace}/data/capybara",
    "--learning_rate=2.0e-5",
    "--num_train_epochs", "1",
    "--per_device_train_batch_size", "2",
    "--gradient_accumulation_steps", "8",
    "--gradient_checkpointing",
    "--bf16",
    "--logging_steps", "25",
    "--output_dir", "{output_dir}",
]  # fmt: skip


def _script_job(args: list[str], gpus: int = 1, accelerator: str = "gpu") -> dict[str, Any]:
    return {
        "name": "sft",
        "entrypoint": {"script": "user/sft.py", "args": args},
        "resources": {"gpus_per_node": gpus, "accelerator": accelerator},
    }


def _a100_40gb(
    count: int = 1, capability: str = "8.0", name: str = "NVIDIA A100-SXM4-40GB"
) -> dict[str, Any]:
    gpus = [
        {"index": i, "name": name, "memory_mb": 40960, "compute_capability": capability} for i in range(count)
    ]
    return {"hostname": "h", "gpus": gpus, "cores": 32, "workspace": "/ws", "runs_dir": "/ws/runs"}


def test_both_spellings_bare_booleans_and_the_last_value_are_read() -> None:
    read = read_script_arguments(
        ["--learning_rate", "1e-4", "--bf16", "--gradient_checkpointing", "false", "--max_steps=-1",
         "--per_device_train_batch_size=4", "--per_device_train_batch_size", "16", "--dataloader_num_workers=2",
         "--fp16=true", "--unrelated", "x"]
    )  # fmt: skip
    assert read.values == {
        "--learning_rate": 1e-4,
        "--bf16": True,
        "--gradient_checkpointing": False,
        "--max_steps": None,
        "--per_device_train_batch_size": 16,
        "--dataloader_num_workers": 2,
        "--fp16": True,
    }
    assert read.given["--per_device_train_batch_size"] == "--per_device_train_batch_size 16"
    assert read_script_arguments(["--learning_rate", "fast"]).problems == [
        "--learning_rate: 'fast' is not what it takes"
    ]


def test_the_memory_estimate_of_trls_sft_arguments_is_shown_and_m001_names_the_arguments(
    client: TestClient,
) -> None:
    body = {"recipe": _script_job(SFT_ARGS), "host": _a100_40gb(), "model_config": LLAMA2_7B}
    dry = client.post("/preflight", json=body, headers=USER).json()
    assert isinstance(dry["memory"], list), dry["memory"]  # not "unknown": read from the arguments
    total = dry["memory"][0]["total_gb"]
    assert 60 < total < 200, total  # a full fine-tune of 7B with AdamW: weights, gradients, two moments
    [m001] = [f for f in dry["findings"] if f["code"] == "M001"]
    assert m001["path"] == "entrypoint.args" and m001["severity"] == "error"
    assert "--per_device_train_batch_size 2" in m001["message"]

    # Half the batch with LoRA (TRL's --use_peft) fits: the estimate follows the arguments.
    lora = [*SFT_ARGS, "--use_peft", "--lora_r", "16"]
    dry = client.post("/preflight", json=body | {"recipe": _script_job(lora)}, headers=USER).json()
    assert dry["memory"][0]["total_gb"] < total / 2
    assert [f for f in dry["findings"] if f["code"] == "M001"] == []


def test_bf16_in_the_arguments_on_a_gpu_without_bf16_is_x001(client: TestClient) -> None:
    body = {"recipe": _script_job(SFT_ARGS), "host": _a100_40gb(1, "7.0", "Tesla V100-SXM2-32GB")}
    findings = client.post("/preflight", json=body, headers=USER).json()["findings"]
    [x001] = [f for f in findings if f["code"] == "X001"]
    assert x001["path"] == "entrypoint.args" and "--bf16" in x001["message"]


def test_float16_weights_with_fp16_in_the_arguments_is_x003_at_submit(client: TestClient) -> None:
    args = ["--model_name_or_path", "gpt2", "--torch_dtype=float16", "--fp16", "--output_dir", "{output_dir}"]
    answer = client.post("/jobs", json=_script_job(args), headers=USER)
    assert answer.status_code == 201, answer.text
    [x003] = [f for f in answer.json()["findings"] if f["code"] == "X003"]
    assert x003["path"] == "entrypoint.args" and x003["severity"] == "warn"
    assert "--torch_dtype=float16" in x003["message"] or "--fp16" in x003["message"]


@pytest.mark.parametrize(
    "args",
    [
        ["--epochs", "3", "--lr", "1e-3"],  # a team's own argparse: not judged by the Trainer's defaults
        ["--model_name_or_path", "gpt2", "--bf16", "--output_dir", "{output_dir}"],  # nothing wrong
    ],
)
def test_arguments_that_say_nothing_wrong_add_no_finding(args: list[str]) -> None:
    plain = run_static_preflight(parse_recipe(_script_job(args, accelerator="cpu")))
    assert [f for f in plain.findings if f.path == "entrypoint.args"] == []


def test_a_script_with_its_own_argument_names_is_not_estimated_with_the_trainers_defaults(
    client: TestClient,
) -> None:
    job = _script_job(["--epochs", "3", "--batch", "64"]) | {"model": {"path": "models/llama-2-7b"}}
    dry = client.post("/preflight", json={"recipe": job, "model_config": LLAMA2_7B}, headers=USER).json()
    assert dry["memory"].startswith("unknown: the script job does not declare data, training")


def test_a_value_beyond_what_a_recipe_allows_is_a_warning_naming_it_not_a_server_error(
    client: TestClient,
) -> None:
    # TRL's sft.py with the learning rate of issue 33's H007 case: the job is stored and runs (H007 at run).
    args = ["--model_name_or_path", "{workspace}/models/tiny-llama", "--learning_rate", "1e4"]
    answer = client.post("/jobs", json=_script_job(args, accelerator="cpu"), headers=USER)
    assert answer.status_code == 201, answer.text
    [warned] = [f for f in answer.json()["findings"] if f["path"] == "entrypoint.args"]
    assert warned["severity"] == "warn" and "--learning_rate 1e4" in warned["message"]
    dry = client.post(
        "/preflight", json={"recipe": _script_job(args), "model_config": LLAMA2_7B}, headers=USER
    )
    assert dry.status_code == 200 and isinstance(dry.json()["memory"], str)
