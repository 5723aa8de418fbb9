"""Memory estimator vs published peaks (and, on a GPU, vs a measured peak).

No GPU was available in the session that wrote this, so the comparison below is against public
figures only (docs/failures.md: Llama-2-7B LoRA 21.3 GB on an A100, QLoRA 13.7-14.1 GB, 19.8 GB on an A10G at
seq 512 x batch 2; field report R4's ~20 GB budget). `--measure` runs one real training step of each
configuration on CUDA (random weights built from the config, synthetic tokens) and prints
torch.cuda.max_memory_allocated next to the estimate; it has not been run on a GPU yet.

    python bench/memory_estimate.py              # estimate vs published, pure Python
    python bench/memory_estimate.py --measure    # also measure on the local GPU (needs the worker extra)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from bench.harness import run_cli
from flightdeck.memory import GB, estimate_memory, model_shape
from flightdeck.memory.reference_models import LLAMA2_7B, QWEN25_7B
from flightdeck.recipe.schema import Recipe


@dataclass(frozen=True)
class Case:
    name: str
    config: dict[str, Any]
    recipe: dict[str, Any]
    published_gb: float
    source: str


def _recipe(
    model: dict[str, Any], adapter: dict[str, Any], seq: int, batch: int, precision: str
) -> dict[str, Any]:
    return {
        "name": "bench",
        "model": {"path": "bench", **model},
        "adapter": adapter,
        "data": {"train": [{"path": "synthetic.jsonl"}], "max_seq_length": seq},
        "training": {"per_device_batch_size": batch, "precision": precision},
    }


QV8 = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
CASES = (
    Case(
        "llama2-7b lora q,v r8 bf16 1x1304",
        LLAMA2_7B,
        _recipe({"gradient_checkpointing": False}, QV8, 1304, 1, "bf16"),
        21.3,
        "A100, lit-gpt LoRA (docs/failures.md)",
    ),
    Case(
        "llama2-7b qlora q,v r8 bf16 1x1304",
        LLAMA2_7B,
        _recipe({"gradient_checkpointing": False, "quantization": "4bit"}, QV8, 1304, 1, "bf16"),
        14.0,
        "7B QLoRA 13.7-14.1 GB (docs/failures.md)",
    ),
    Case(
        "llama2-7b lora q,v r8 bf16 2x512",
        LLAMA2_7B,
        _recipe({"gradient_checkpointing": False}, QV8, 512, 2, "bf16"),
        19.8,
        "A10G, seq 512, micro-batch 2 (docs/failures.md)",
    ),
    Case(
        "qwen2.5-7b lora all-linear r128 fp16 ckpt 1x512",
        QWEN25_7B,
        _recipe({"dtype": "float16"}, {"r": 128, "target_modules": "all-linear"}, 512, 1, "fp16"),
        20.0,
        "R4's hand budget for 24 GB (docs/failures.md)",
    ),
)


def estimate(case: Case) -> float:
    shape = model_shape(case.config)
    assert shape is not None
    return estimate_memory(Recipe.model_validate(case.recipe), shape).total / GB


def measure(case: Case) -> float:
    """One forward/backward/AdamW step on CUDA with random weights; peak allocated bytes in GB."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    recipe = Recipe.model_validate(case.recipe)
    config = AutoConfig.for_model(**case.config)
    dtype = getattr(torch, recipe.model.dtype)
    torch.cuda.reset_peak_memory_stats()
    if recipe.model.quantization == "4bit":
        # bitsandbytes quantises at load time only: save random weights once, then load them quantised.
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(tmp)
            quant = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
            )
            torch.cuda.reset_peak_memory_stats()
            model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=quant, device_map={"": 0})
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    else:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if recipe.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    assert recipe.adapter is not None
    lora = LoraConfig(
        r=recipe.adapter.r, lora_alpha=recipe.adapter.alpha, target_modules=recipe.adapter.target_modules
    )
    model = get_peft_model(model, lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch, seq = recipe.training.per_device_batch_size, recipe.data.max_seq_length
    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
    autocast = torch.autocast(
        "cuda", dtype=torch.bfloat16 if recipe.training.precision == "bf16" else torch.float16
    )
    for _ in range(2):  # the second step includes the optimizer state
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated() / GB
    del model, optimizer
    torch.cuda.empty_cache()
    return peak


def run(
    measure_gpu: Annotated[
        bool, typer.Option("--measure", help="also measure each case on the local CUDA GPU")
    ] = False,
) -> None:
    print(f"{'case':<50} {'estimate':>9} {'published':>10} {'error':>7}  {'measured':>9}  source")
    for case in CASES:
        est = estimate(case)
        measured = f"{measure(case):8.2f}G" if measure_gpu else "        -"
        error = (est - case.published_gb) / case.published_gb
        print(
            f"{case.name:<50} {est:8.2f}G {case.published_gb:9.2f}G {error:+7.1%}  {measured}  {case.source}"
        )


def main(argv: list[str] | None = None) -> None:
    run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
