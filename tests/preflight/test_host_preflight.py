"""Host rules against real files (tiny llama, small datasets) and described GPU inventories."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightdeck.inventory import WorkerInventory
from flightdeck.memory import model_shape
from flightdeck.recipe import parse_recipe
from flightdeck.recipe.findings import Finding
from flightdeck.worker.host_preflight import find_free_port, run_host_preflight
from flightdeck.worker.host_preflight.data_rules import check_data
from flightdeck.worker.host_preflight.model_probe import build_on_meta

from .factories import inventory, make_recipe

QA = {"data": {"train": [{"path": "data/qa.jsonl"}]}, "training": {"gradient_accumulation_steps": 1}}


def _run(
    workspace: Path, *layers: dict[str, Any], host: WorkerInventory | None = None, **kw: Any
) -> list[Finding]:
    recipe = make_recipe(QA, *layers)
    return run_host_preflight(
        recipe, host or inventory(), workspace, [], environ=kw.get("environ", {})
    ).findings


def _codes(findings: list[Finding]) -> dict[str, str]:
    return {f.code or "": f.severity for f in findings}


def test_clean_recipe_has_only_the_pad_token_record(workspace: Path) -> None:
    assert _codes(_run(workspace)) == {"G009": "fix"}
    assert _codes(_run(workspace, {"model": {"path": "models/tiny-llama-bf16"}})) == {}


# A fresh agent's first host check, as every Slurm attempt runs it: a LoRA recipe on the tiny model.
_FIRST_CHECK = """
import sys
from pathlib import Path
from flightdeck.inventory import WorkerInventory
from flightdeck.recipe.schema import Recipe
from flightdeck.worker.host_preflight import run_host_preflight

recipe = Recipe.model_validate(
    {"name": "first", "model": {"path": "models/tiny-llama"}, "data": {"train": [{"path": "data/qa.jsonl"}]}}
)
found = run_host_preflight(recipe, WorkerInventory(cpu_slots=1), Path(sys.argv[1]), [], environ={}).findings
print("G009" in [f.code for f in found], sorted(m for m in ("peft", "bitsandbytes") if m in sys.modules))
"""


def test_a_fresh_processs_host_check_loads_neither_peft_nor_bitsandbytes(workspace: Path) -> None:
    """The probe reads the model's config, tokenizer and classes; the trainer's peft and bitsandbytes
    (2-3 s of a fresh agent's first check here, bench/README.md "First step") are not its to load."""
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_CHECK, str(workspace)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "True []", done.stdout  # G009: the tokenizer was probed


def test_d001_names_the_fields_that_exist(workspace: Path) -> None:
    findings = _run(workspace, {"data": {"train": [{"path": "data/chartqa_flat.jsonl"}]}})
    d001 = [f for f in findings if f.code == "D001"]
    assert d001 and d001[0].severity == "error" and "query" in d001[0].message and "label" in d001[0].message
    assert d001[0].path == "data.train[0].fields"
    # The fix is the finding's fix (the fix column of `flightdeck show`), not only a clause of the message.
    assert d001[0].fix is not None and '"preset": "chartqa"' in d001[0].fix, d001[0]
    fixed = _run(workspace, {"data": {"train": [{"path": "data/chartqa_flat.jsonl", "preset": "chartqa"}]}})
    assert "D001" not in _codes(fixed)


def test_d001_a_prompt_template_name_the_samples_lack_has_its_fix(workspace: Path) -> None:
    findings = _run(workspace, {"data": {"prompt_template": "Q: {instruction}\nA: "}})
    (d001,) = [f for f in findings if f.code == "D001"]
    assert d001.path == "data.prompt_template" and "{instruction}" in d001.message
    assert d001.fix and d001.fix.startswith("use only these names in data.prompt_template"), d001


def test_d002_flattening_is_recorded_with_counts(workspace: Path) -> None:
    findings = _run(workspace, {"data": {"train": [{"path": "data/ocrvqa.jsonl", "preset": "ocrvqa"}]}})
    d002 = [f for f in findings if f.code == "D002"]
    assert d002 and d002[0].severity == "fix" and "10 rows give 20 samples" in d002[0].message
    assert "D002" not in _codes(_run(workspace))


def test_d003_names_the_splits_that_exist(workspace: Path) -> None:
    source = {"path": "data/chartqa", "preset": "chartqa"}
    findings = _run(workspace, {"data": {"eval": [source | {"split": "validation"}]}})
    d003 = [f for f in findings if f.code == "D003"]
    assert d003 and d003[0].path == "data.eval[0].split" and "val" in d003[0].message
    assert d003[0].fix == "set the source's 'split' to 'val'"
    assert "D003" not in _codes(_run(workspace, {"data": {"eval": [source | {"split": "val"}]}}))


def test_d012_a_data_path_that_is_not_there_names_the_near_file_on_the_path_field(workspace: Path) -> None:
    source = {"path": "data/chartqa/tarin.jsonl", "preset": "chartqa"}
    [d012] = [f for f in _run(workspace, {"data": {"train": [source]}}) if f.code == "D012"]
    assert d012.severity == "error" and d012.path == "data.train[0].path", d012
    assert "does not exist" in d012.message and d012.fix, d012


def test_d005_reports_the_sample_without_supervised_tokens(workspace: Path) -> None:
    long = {"data": {"train": [{"path": "data/long.jsonl"}], "max_seq_length": 32}}
    findings = _run(workspace, long, {"training": {"per_device_batch_size": 1}})
    d005 = [f for f in findings if f.code == "D005"]
    assert d005 and "sample 0" in d005[0].message and "max_seq_length 32" in d005[0].message
    assert d005[0].fix is not None and "raise data.max_seq_length above" in d005[0].fix, d005[0]
    roomy = {"data": {"train": [{"path": "data/long.jsonl"}], "max_seq_length": 512}}
    assert "D005" not in _codes(_run(workspace, roomy, {"training": {"per_device_batch_size": 1}}))


def test_prompt_completion_rows_are_checked_with_their_prompts_as_given(
    workspace: Path, tmp_path: Path
) -> None:
    """No D001 for TRL's columns under the preset; D005 measures the prompt itself (no template) and
    says to shorten the data's prompts, which the recipe's prompt_template does not wrap."""
    rows = [
        {"prompt": f"Count to {i}:", "completion": " " + " ".join(map(str, range(i)))} for i in range(1, 9)
    ]
    path = tmp_path / "pc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = {"path": str(path), "preset": "prompt_completion"}
    batch = {"training": {"per_device_batch_size": 1}}
    assert _codes(_run(workspace, {"data": {"train": [source]}}, batch)) == {"G009": "fix"}
    long = [*rows[:1], {"prompt": "word " * 40, "completion": " done"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in long))
    findings = _run(workspace, {"data": {"train": [source], "max_seq_length": 32}}, batch)
    d005 = [f for f in findings if f.code == "D005"]
    assert d005 and "sample 1" in d005[0].message, findings
    from transformers import AutoTokenizer

    tokens = len(
        AutoTokenizer.from_pretrained(workspace / "models" / "tiny-llama")("word " * 40)["input_ids"]
    )
    assert f"its prompt is {tokens} tokens" in d005[0].message  # the prompt itself, no template around it
    assert d005[0].fix is not None and "shorten the source's prompts" in d005[0].fix, d005[0]


def test_d007_dataset_smaller_than_one_global_batch(workspace: Path) -> None:
    # 40 samples; 2 x 2 processes x 16 = 64 per optimizer step.
    big = {"training": {"gradient_accumulation_steps": 16}, "resources": {"gpus_per_node": 2}}
    [d007] = [f for f in _run(workspace, big, host=inventory(2)) if f.code == "D007"]
    assert d007.severity == "error" and "40 training samples" in d007.message
    # The fix is the finding's fix (shown in its own column), with the accumulation that gives one step.
    assert d007.fix is not None and "gradient_accumulation_steps to 10 or less" in d007.fix, d007
    huge = {"training": {"per_device_batch_size": 32}, "resources": {"gpus_per_node": 2}}
    [d007] = [f for f in _run(workspace, huge, host=inventory(2)) if f.code == "D007"]
    assert d007.fix is not None and "per_device_batch_size to 20 or less" in d007.fix, d007
    small = {"training": {"gradient_accumulation_steps": 8}, "resources": {"gpus_per_node": 2}}
    assert "D007" not in _codes(_run(workspace, small, host=inventory(2)))


def test_g006_lists_candidate_module_names(workspace: Path) -> None:
    findings = _run(workspace, {"adapter": {"target_modules": ["query", "value"]}})
    g006 = [f for f in findings if f.code == "G006"]
    assert g006 and "q_proj" in g006[0].message and "down_proj" in g006[0].message
    assert "lm_head" not in g006[0].message
    for targets in (["q_proj", "v_proj"], "all-linear", ["self_attn.o_proj"]):
        assert "G006" not in _codes(_run(workspace, {"adapter": {"target_modules": targets}}))


def test_d006_caps_sequence_at_the_position_table(workspace: Path) -> None:
    result = run_host_preflight(
        make_recipe(QA, data={"max_seq_length": 1024}), inventory(), workspace, [], environ={}
    )
    assert [(f.code, f.value) for f in result.findings if f.code == "D006"] == [("D006", 512)]
    assert result.effective.data.max_seq_length == 512
    assert "D006" not in _codes(_run(workspace, {"data": {"max_seq_length": 512}}))


def test_x002_fp16_on_a_bf16_model(workspace: Path) -> None:
    bf16 = {"model": {"path": "models/tiny-llama-bf16", "dtype": "float16"}}
    assert _codes(_run(workspace, bf16, {"training": {"precision": "fp16"}})).get("X002") == "warn"
    assert "X002" not in _codes(_run(workspace, bf16, {"training": {"precision": "bf16"}}))
    fp32 = {"model": {"dtype": "float16"}, "training": {"precision": "fp16"}}
    assert "X002" not in _codes(_run(workspace, fp32))


def test_unreadable_model_is_an_error(workspace: Path) -> None:
    findings = _run(workspace, {"model": {"path": "models/missing"}})
    assert [(f.path, f.severity) for f in findings if f.path == "model.path"] == [("model.path", "error")]


def test_gpu_facts_from_the_inventory(workspace: Path) -> None:
    t4 = inventory(1, name="Tesla T4", memory_mb=15360, cc="7.5")
    assert _codes(_run(workspace, host=t4)).get("X001") == "error"
    assert "X001" not in _codes(_run(workspace, {"training": {"precision": "fp16"}}, host=t4))
    assert _codes(_run(workspace, {"resources": {"gpus_per_node": 2}})).get("P004") == "error"
    assert "P004" not in _codes(_run(workspace, {"resources": {"gpus_per_node": 2}}, host=inventory(2)))
    tiny_gpu = inventory(1, memory_mb=64)
    assert _codes(_run(workspace, host=tiny_gpu)).get("M001") == "error"


def test_gpus_of_unknown_memory_are_not_held_to_a_zero_budget(workspace: Path) -> None:
    """A Slurm partition's GPUs as GRES lists them (`gpu:a100:4`): no memory to check against, not 0 GB."""
    from_gres = inventory(1, name="a100", memory_mb=0, cc="8.0")
    assert not {"M001", "M002"} & set(_codes(_run(workspace, host=from_gres)))


def test_m001_from_a_script_jobs_arguments_runs_again_against_the_hosts_real_gpus(workspace: Path) -> None:
    # TRL's sft.py as a user runs it: nothing declared but the script and its HF arguments.
    (workspace / "user").mkdir(exist_ok=True)
    (workspace / "user" / "sft_m001.py").write_text("print('training')\n")
    args = [
        "--model_name_or_path", "{workspace}/models/tiny-llama", "--output_dir", "{output_dir}",
        "--per_device_train_batch_size", "64", "--max_length", "2048", "--bf16",
    ]  # fmt: skip
    job = parse_recipe(
        {
            "name": "sft",
            "entrypoint": {"script": "user/sft_m001.py", "args": args},
            "resources": {"accelerator": "gpu"},
        }
    )
    small = inventory(1, memory_mb=96)  # what the worker found: a 96 MB device
    findings = run_host_preflight(job, small, workspace, [0], environ={}).findings
    [m001] = [f for f in findings if f.code == "M001"]
    assert (m001.severity, m001.path, m001.where) == ("error", "entrypoint.args", "host")
    assert "--per_device_train_batch_size 64" in m001.message and "0.1 GB per GPU" in m001.message
    assert [f.code for f in run_host_preflight(job, inventory(1), workspace, [0], environ={}).findings] == []
    # --bf16 on a GPU without bf16 is X001 there too.
    t4 = inventory(1, name="Tesla T4", memory_mb=15360, cc="7.5")
    [x001] = [f for f in run_host_preflight(job, t4, workspace, [0], environ={}).findings if f.code == "X001"]
    assert x001.path == "entrypoint.args" and "--bf16" in x001.message


def test_p005_reports_inherited_launcher_variables(workspace: Path) -> None:
    findings = _run(workspace, environ={"RANK": "3", "WORLD_SIZE": "8", "PATH": "/usr/bin"})
    p005 = [f for f in findings if f.code == "P005"]
    assert p005 and "RANK=3" in p005[0].message and "WORLD_SIZE=8" in p005[0].message
    assert "PATH" not in p005[0].message
    assert "P005" not in _codes(_run(workspace, environ={"PATH": "/usr/bin"}))


def test_e002_busy_master_port_is_replaced(workspace: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_host_preflight(
            make_recipe(QA, env={"MASTER_PORT": str(port)}), inventory(), workspace, []
        )
        e002 = [f for f in result.findings if f.code == "E002"]
        # Reported here; the launch resolves the replacement once (tests/agent/test_attempt.py).
        assert e002 and e002[0].value is None and "the launch takes a port" in (e002[0].fix or "")
        assert result.effective.env["MASTER_PORT"] == str(port)
    free = find_free_port()
    assert "E002" not in _codes(_run(workspace, {"env": {"MASTER_PORT": str(free)}}))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "bert"])
def test_arithmetic_parameter_count_matches_the_meta_device_model(arch: str) -> None:
    from transformers import BertConfig, LlamaConfig, Qwen2Config

    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = {"llama": LlamaConfig, "qwen2": Qwen2Config, "bert": BertConfig}[arch](vocab_size=300, **sizes)
    model = build_on_meta(config, "masked_lm" if arch == "bert" else "causal_lm")
    shape = model_shape(config.to_dict())
    assert shape is not None
    assert shape.total_parameters == sum(p.numel() for p in model.parameters())


def test_d008_blank_rows_are_reported_with_their_row_numbers(workspace: Path, tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "answer": "" if i in (2, 5) else str(i)} for i in range(1, 9)]
    path = tmp_path / "blank.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    findings = _run(workspace, {"data": {"train": [{"path": str(path)}]}})
    d008 = [f for f in findings if f.code == "D008"]
    assert d008 and d008[0].severity == "fix" and "lines 2, 5" in d008[0].message
    assert "D004" not in _codes(findings) and "D005" not in _codes(findings)


def test_g011_writes_the_embeddings_a_new_pad_token_trains_into_the_effective_recipe(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pad token added under LoRA trains and saves embed_tokens and lm_head: the effective recipe (the
    run's recipe.json) lists them, so the memory estimate counts them."""
    import shutil

    import flightdeck.worker.train.model as model_module
    from flightdeck.memory import estimate_memory

    model = tmp_path / "no-pad"
    shutil.copytree(workspace / "models/tiny-llama", model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    monkeypatch.setattr(model_module, "reusable_pad_token", lambda tokenizer: None)  # no spare token
    recipe = make_recipe(QA, {"model": {"path": str(model)}, "adapter": {"modules_to_save": ["score"]}})
    result = run_host_preflight(recipe, inventory(), workspace, [], environ={})
    (g011,) = [f for f in result.findings if f.code == "G011"]
    saved = ["score", "embed_tokens", "lm_head"]
    assert result.effective.adapter is not None and result.effective.adapter.modules_to_save == saved
    assert g011.value == saved and "embed_tokens" in (g011.fix or "")
    shape = model_shape(json.loads((model / "config.json").read_text()))
    assert shape is not None
    before = estimate_memory(recipe, shape)
    after = estimate_memory(result.effective, shape)
    assert after.trainable_parameters - before.trainable_parameters == 2 * shape.vocab * shape.hidden


def test_d008_numbers_are_the_files_own_lines_blank_lines_included(workspace: Path, tmp_path: Path) -> None:
    """Regression: a blank row at file line 4 after an empty line 2 was reported as row 3."""
    lines = [json.dumps({"question": "q1", "answer": "1"}), ""]
    lines += [json.dumps({"question": "q3", "answer": "3"}), json.dumps({"question": "q4", "answer": ""})]
    path = tmp_path / "gappy.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (d008,) = [f for f in _run(workspace, {"data": {"train": [{"path": str(path)}]}}) if f.code == "D008"]
    assert "lines 4)" in d008.message and "1 of the first 3 rows" in d008.message


def test_d008_reports_the_empty_lines_of_a_text_file(workspace: Path, tmp_path: Path) -> None:
    """An empty .txt line is an empty text: left out, and said so (it used to vanish without a D008)."""
    path = tmp_path / "corpus.txt"
    path.write_text("first line\n\nthird line\n   \nfifth line\n")
    recipe = {"task": "masked_lm", "data": {"train": [{"path": str(path)}]}}
    (d008,) = [f for f in _run(workspace, recipe) if f.code == "D008"]
    assert "lines 2, 4)" in d008.message


def test_m003_a_large_eval_set_is_evaluated_without_keeping_logits(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flightdeck.worker.host_preflight import data_rules

    evaluated = {"data": {"eval": [{"path": "data/qa.jsonl"}]}}
    assert "M003" not in _codes(_run(workspace, evaluated))
    monkeypatch.setattr(data_rules, "EVAL_LOGITS_BYTES", 1024)  # a GPU this small makes any eval set large
    m003 = [f for f in _run(workspace, evaluated) if f.code == "M003"]
    assert m003 and m003[0].severity == "fix" and "prediction_loss_only" in (m003[0].fix or "")


def test_a_model_path_typo_names_the_nearest_models_not_the_hub(workspace: Path) -> None:
    findings = _run(workspace, {"model": {"path": "models/tiny-lama"}})
    (problem,) = [f for f in findings if f.path == "model.path" and f.severity == "error"]
    assert problem.code == "P008"
    assert "does not exist under the workspace" in problem.message and "models/tiny-llama" in problem.message
    assert "huggingface" not in problem.message.lower()
    assert problem.fix == "set model.path to 'models/tiny-llama'"  # the job's failure_fix says it too


@pytest.fixture
def named_pipe(tmp_path: Path) -> Iterator[Path]:
    """A named pipe fed jsonl rows by a writer thread, as a download piped into the workspace would be:
    each reader that opens it gets 32 rows. Without D009 the host would read it (and the test fail, not
    hang); at the end a non-blocking reader releases a writer still waiting for one."""
    pipe = tmp_path / "stream.jsonl"
    os.mkfifo(pipe)
    rows = "".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(32))
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            try:
                with pipe.open("w") as writer:  # blocks until a reader opens the pipe
                    writer.write(rows)
            except BrokenPipeError:
                pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    yield pipe
    stop.set()
    while writer.is_alive():
        os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=0.1)


def test_d009_a_streamed_source_is_refused_without_reading_it(workspace: Path, named_pipe: Path) -> None:
    streamed = {"data": {"train": [{"path": str(named_pipe)}]}}
    d009 = [f for f in _run(workspace, streamed) if f.code == "D009"]
    assert [(f.severity, f.path) for f in d009] == [("error", "data.train[0].path")]
    assert "training.max_steps" in d009[0].message and "named pipe" in d009[0].message
    # max_steps does not make a stream indexable by the trainer: still refused, and the message says so.
    bounded = [f for f in _run(workspace, streamed, {"training": {"max_steps": 5}}) if f.code == "D009"]
    assert bounded and "even with training.max_steps set" in bounded[0].message
    assert bounded[0].fix and "write the stream to a file" in bounded[0].fix


def test_d009_a_script_reading_a_stream_needs_max_steps(workspace: Path, named_pipe: Path) -> None:
    script = {
        "name": "streamed-script",
        "entrypoint": {"script": "train.py"},
        "data": {"train": [{"path": str(named_pipe)}]},
    }
    unbounded = check_data(parse_recipe(script), workspace, None)
    assert [(f.code, f.severity, f.path) for f in unbounded] == [("D009", "error", "training.max_steps")]
    assert unbounded[0].fix and "set training.max_steps" in unbounded[0].fix
    bounded = check_data(parse_recipe({**script, "training": {"max_steps": 10}}), workspace, None)
    assert [f for f in bounded if f.code == "D009"] == []


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _chat_model(workspace: Path, tmp_path: Path, template: str | None) -> Path:
    """A copy of tiny-llama-bf16 whose tokenizer carries `template` (None: no chat template at all)."""
    import shutil

    from transformers import AutoTokenizer

    model = tmp_path / "chat-model"
    shutil.copytree(workspace / "models" / "tiny-llama-bf16", model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(model)
    return model


def test_d010_chat_data_on_a_model_without_a_usable_chat_template(workspace: Path, tmp_path: Path) -> None:
    turns = [{"role": "user", "content": f"q {i}"} for i in range(1)] + [
        {"role": "assistant", "content": "a"}
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"messages": turns}) + "\n" for _ in range(40)))
    chat = {"data": {"train": [{"path": str(tmp_path / "chat.jsonl"), "preset": "messages"}]}}
    bare = _run(workspace, chat, {"model": {"path": "models/tiny-llama-bf16"}})
    (d010,) = [f for f in bare if f.code == "D010"]
    assert d010.severity == "error" and d010.path == "data.train[0].preset"
    assert "no chat_template" in d010.message
    # The fix in its own field (the failure's fix), said once: not again in the message.
    assert d010.fix and "instruct or chat variant" in d010.fix and "instruct" not in d010.message
    shifted = _chat_model(workspace, tmp_path, "{{ messages|length }}" + CHATML)  # renders do not nest
    (d010,) = [f for f in _run(workspace, chat, {"model": {"path": str(shifted)}}) if f.code == "D010"]
    assert "assistant turns cannot be found" in d010.message and "{% generation %}" not in d010.message
    assert d010.fix and d010.fix.startswith("give the template a {% generation %}")
    templated = _chat_model(workspace, tmp_path / "ok", CHATML)
    assert "D010" not in _codes(_run(workspace, chat, {"model": {"path": str(templated)}}))


def test_d005_a_conversation_answered_past_max_seq_length_names_the_length_it_needs(
    workspace: Path, tmp_path: Path
) -> None:
    """A chat sample's prompt is the turns before the first answer (a long system prompt), not the empty
    prompt_template and answer of a question/answer sample."""
    from transformers import AutoTokenizer

    from flightdeck.worker.train.chat import tokenize_chat

    turns = [
        {"role": "system", "content": "You read charts and answer with one number. " * 3},
        {"role": "user", "content": "What is bar 3?"},
        {"role": "assistant", "content": "42"},
    ]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    model = _chat_model(workspace, tmp_path, CHATML)
    labels = tokenize_chat(
        {"messages": json.dumps(turns)}, AutoTokenizer.from_pretrained(model), max_seq_length=None
    )["labels"]
    first = next(i for i, label in enumerate(labels) if label != -100)
    assert first > 32
    chat = {
        "data": {
            "train": [{"path": str(tmp_path / "chat.jsonl"), "preset": "messages"}],
            "max_seq_length": 32,
        }
    }
    findings = _run(
        workspace, chat, {"model": {"path": str(model)}, "training": {"per_device_batch_size": 1}}
    )
    (d005,) = [f for f in findings if f.code == "D005"]
    assert (
        f"its first assistant token is token {first + 1}" in d005.message and "answer ''" not in d005.message
    )
    assert d005.fix and d005.fix.startswith(f"raise data.max_seq_length above {first} tokens"), d005.fix


def test_d009_a_streamed_source_needs_max_steps(workspace: Path) -> None:
    streamed = {"data": {"train": [{"path": "data/qa.jsonl", "streaming": True}]}}
    findings = _run(workspace, streamed, {"training": {"max_steps": None}})
    assert [f.path for f in findings if f.code == "D009"] == ["training.max_steps"]
    (d009,) = [f for f in findings if f.code == "D009"]
    assert d009.fix and d009.fix.startswith("set training.max_steps, or drop")
    assert "D009" not in _codes(_run(workspace, streamed, {"training": {"max_steps": 5}}))
