"""POST/GET /jobs, cancel, schema: the user's side of the API against a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from flightdeck.memory.reference_models import LLAMA2_7B
from flightdeck.recipe.validate import expand_stages, parse_recipe
from tests.service.factories import USER, WORKER, recipe


def refused(client: TestClient, body: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    """POST /jobs with `body`, which must be refused: {path: (message, fix)} of its findings."""
    answer = client.post("/jobs", json=body, headers=USER)
    assert answer.status_code == 422, answer.text
    return {f["path"]: (f["message"], f["fix"]) for f in answer.json()["findings"]}


def test_submit_stores_the_job_queued(client: TestClient) -> None:
    answer = client.post("/jobs", json=recipe(), headers=USER)
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert job["status"] == "queued" and job["name"] == "tiny-lora"
    assert job["recipe"] == recipe()
    assert job["effective_recipe"]["resources"]["gpus_per_node"] == 2
    assert isinstance(job["findings"], list)
    assert [f["code"] for f in job["fixes_applied"]] == [
        f["code"] for f in job["findings"] if f["severity"] == "fix"
    ]
    stored = client.get(f"/jobs/{job['id']}", headers=USER)
    assert stored.status_code == 200
    assert stored.json()["attempts"] == [] and stored.json()["recipe"] == recipe()


def test_refused_recipe_lists_every_problem_and_stores_nothing(client: TestClient) -> None:
    bad = recipe(env={"LD_PRELOAD": "x"}, extra=True)
    bad["training"]["learning_rate"] = 0
    answer = client.post("/jobs", json=bad, headers=USER)
    assert answer.status_code == 422
    found = {f["path"]: f for f in answer.json()["findings"]}
    assert set(found) == {"env.LD_PRELOAD", "extra", "training.learning_rate"}
    assert found["env.LD_PRELOAD"]["code"] == "E006"
    assert all(f["message"] for f in found.values())
    assert client.get("/jobs", headers=USER).json()["count"] == 0


def test_a_misspelt_key_gets_did_you_mean_in_the_422(client: TestClient) -> None:
    typo = recipe()
    typo["training"]["learning_rat"] = typo["training"].pop("learning_rate", 0.0002)
    typo["stages"] = [{"training": {"max_stepz": 3}}, {"model": {"path": "@previous"}}]
    answer = client.post("/jobs", json=typo | {"zzz_unrelated": 1}, headers=USER)
    assert answer.status_code == 422
    found = {f["path"]: f["message"] for f in answer.json()["findings"]}
    assert "did you mean 'learning_rate'?" in found["training.learning_rat"], found
    assert "did you mean 'max_steps'?" in found["stages[0].training.max_stepz"], found
    assert "did you mean" not in found["zzz_unrelated"] and "unknown key" in found["zzz_unrelated"]


def test_a_key_named_as_other_tools_name_it_gets_the_recipes_name(client: TestClient) -> None:
    # As TrainingArguments, LoraConfig and Axolotl configs spell them: no spelling match would find these.
    body = recipe()
    body["training"] |= {"num_train_epochs": 3, "lr": 1e-4, "per_device_train_batch_size": 8}
    body["adapter"] = {"lora_r": 8}
    found = refused(client, body)
    assert {path: message.split("?")[0] for path, (message, _) in found.items()} == {
        "training.num_train_epochs": "unknown key; did you mean 'epochs'",
        "training.lr": "unknown key; did you mean 'learning_rate'",
        "training.per_device_train_batch_size": "unknown key; did you mean 'per_device_batch_size'",
        "adapter.lora_r": "unknown key; did you mean 'r'",
    }, found
    assert found["training.lr"][1] == "rename 'lr' to 'learning_rate'"


def test_a_flat_config_gets_each_key_moved_into_its_section_not_removed(client: TestClient) -> None:
    # An Axolotl config, or TrainingArguments written out flat: the settings at the top, beside the
    # sections. "Remove it" would lose them; `learning_rate` must not be taken for a misspelt `training`.
    body = recipe()
    body |= {"learning_rate": 2e-4, "lora_r": 8, "base_model": "models/x", "nproc_per_node": 2, "bf16": True}
    body |= {"lora": {"r": 8}, "datasets": [{"path": "data/a.jsonl", "type": "alpaca"}], "sample_packing": 1}
    body["stages"] = [{"num_epochs": 2}, {"model": {"path": "@previous"}}]
    found = refused(client, body)
    assert found["learning_rate"] == (
        "unknown key at the top level; 'learning_rate' belongs in 'training' ('training.learning_rate')",
        "move 'learning_rate' into 'training'",
    )
    assert found["lora_r"][1] == "move 'lora_r' into 'adapter' as 'r'"
    assert found["base_model"][1] == "move 'base_model' into 'model' as 'path'"
    assert found["nproc_per_node"][1] == "move 'nproc_per_node' into 'resources' as 'gpus_per_node'"
    assert found["bf16"][1].startswith(
        'in \'training\': replace it with "precision": "bf16" where it was true'
    )
    assert found["stages[0].num_epochs"] == (
        "unknown key in a stage; 'num_epochs' belongs in 'training' ('training.epochs')",
        "move 'num_epochs' into 'training' as 'epochs'",
    )
    # A section under another tool's name: renamed when its contents carry over, rebuilt when they do not.
    assert found["lora"][1] == "rename 'lora' to 'adapter'"
    assert found["datasets"][1].startswith(
        'give its sources as "data": {"train": [{"path": "data/a.jsonl", "preset": "alpaca"}]}'
    )
    # A key no section has stays unknown.
    assert found["sample_packing"] == (
        "unknown key; remove it or fix its spelling (see GET /recipes/schema)",
        None,
    )
    assert client.get("/jobs", headers=USER).json()["count"] == 0


def test_axolotls_shapes_get_the_recipes_and_the_recipe_with_the_fixes_applied_is_accepted(
    client: TestClient,
) -> None:
    # As Axolotl writes them: the adapter's method as a word, the model as its name, each source's format
    # as `type`, its own settings for what Flightdeck always does, and a scalar whose name is near a
    # section's (`train_on_inputs` is no misspelt `training`: a section is an object).
    body = recipe(model="models/tiny-llama", adapter="qlora", train_on_inputs=False, output_dir="./out")
    body["bf16"] = "auto"
    body["data"]["train"] = [{"path": "data/alpaca.jsonl", "type": "alpaca"}]
    body["stages"] = [{"gpus_per_node": 2, "training": {"max_steps": 3}}]
    found = refused(client, body)
    assert found["adapter"] == (
        "must be an object of settings (GET /recipes/schema); got 'qlora'",
        'give LoRA\'s settings as an object: "adapter": {} takes the defaults (r 16, alpha 32, '
        'target_modules ["q_proj", "v_proj"]), or set "r", "alpha" and "target_modules" in it, and set '
        '"quantization": "4bit" in "model"',
    )
    assert found["model"][1] == 'give it as "model": {"path": "models/tiny-llama"}'
    assert found["train_on_inputs"] == (
        "unknown key: a causal_lm recipe trains on the answer's tokens only, never the prompt's "
        "(train_on_inputs false); there is no setting for it",
        "remove it",
    )
    assert found["output_dir"][1] == "remove it"
    assert found["data.train[0].type"][1] == "rename 'type' to 'preset'"
    assert found["bf16"][1].startswith(
        'in \'training\': replace it with "precision": "bf16" where it was true or auto'
    )
    assert found["stages[0].gpus_per_node"] == (
        "unknown key in a stage; 'gpus_per_node' belongs in 'resources' ('resources.gpus_per_node'), "
        "which only the top level sets: all stages run in the job's one launch",
        "at the top level: move 'gpus_per_node' into 'resources'; or submit this stage as a job of its own",
    )
    assert set(found) == {
        "adapter", "model", "train_on_inputs", "output_dir", "data.train[0].type", "stages[0].gpus_per_node",
        "bf16",
    }  # fmt: skip
    assert client.get("/jobs", headers=USER).json()["count"] == 0
    # Each fix applied as it is written: accepted.
    fixed = recipe(model={"path": "models/tiny-llama", "quantization": "4bit"}, adapter={})
    fixed["training"]["precision"] = "bf16"
    fixed["data"]["train"] = [{"path": "data/alpaca.jsonl", "preset": "alpaca"}]
    fixed["stages"] = [{"training": {"max_steps": 3}}]
    accepted = client.post("/jobs", json=fixed, headers=USER)
    assert accepted.status_code == 201, accepted.text


def test_another_tools_value_for_a_key_gets_the_recipes_value_and_the_fixed_recipe_is_accepted(
    client: TestClient,
) -> None:
    # Values as Axolotl, TRL and LLaMA-Factory write them (transformers' optimizer names, Axolotl's
    # `type: chat_template`): in a renamed or moved key, and in the recipe's own key.
    body = recipe(optimizer="paged_adamw_32bit")
    body["data"]["train"] = [
        {"path": "data/chat.jsonl", "type": "chat_template"},
        {"path": "data/chat.jsonl", "preset": "Chat_Template"},
    ]
    body["training"] |= {"optim": "adamw_bnb_8bit"}
    body["stages"] = [
        {"training": {"optimizer": "adamw_torch_fused"}},
        {"training": {"optimizer": "lion_8bit"}},
    ]
    found = refused(client, body)
    assert found["optimizer"][1] == (
        "move 'optimizer' into 'training', its value as \"adamw_torch\" (the same AdamW with 32-bit states, "
        'not paged; "paged_adamw_8bit" pages 8-bit ones)'
    )
    messages = '"messages" (a "messages" list of role and content, as Axolotl\'s chat_template)'
    assert found["data.train[0].type"][1] == f"rename 'type' to 'preset', its value as {messages}"
    assert found["data.train[1].preset"][1] == f'give it as "preset": {messages}'
    assert (
        found["training.optim"][1]
        == "rename 'optim' to 'optimizer', its value as \"adamw_8bit\" (bitsandbytes' 8-bit AdamW)"
    )
    assert found["stages[0].training.optimizer"] == (
        "must be 'adamw_torch', 'adamw_8bit', 'paged_adamw_8bit', 'adafactor' or 'sgd'; got 'adamw_torch_fused'",
        'give it as "optimizer": "adamw_torch" (the same AdamW update)',
    )
    assert found["stages[1].training.optimizer"][1] is None  # no counterpart: the message lists the values
    assert len(found) == 6
    assert client.get("/jobs", headers=USER).json()["count"] == 0
    fixed = recipe()
    fixed["training"] |= {"optimizer": "adamw_8bit"}
    fixed["data"]["train"] = [{"path": "data/chat.jsonl", "preset": "messages"}] * 2
    fixed["stages"] = [{"training": {"optimizer": "adamw_torch"}}]
    accepted = client.post("/jobs", json=fixed, headers=USER)
    assert accepted.status_code == 201, accepted.text


def test_axolotls_datasets_list_becomes_the_recipes_sources_and_the_fix_followed_literally_is_accepted(
    client: TestClient,
) -> None:
    # Axolotl's `datasets` as its examples write it: each source's path and format (`type`), with settings
    # of its own beside them (the chat template's messages field).
    body = recipe(chat_template="llama3")  # its choice of a chat format, at the top level
    body["datasets"] = [
        {"path": "data/chat.jsonl", "type": "chat_template", "field_messages": "messages"},
        {"path": "data/alpaca.jsonl", "type": "alpaca", "split": "train[:1000]"},
        {
            "path": "data/sharegpt.jsonl",
            "type": "chat_template",
            "field_messages": "conversations",
            "split": "validation",
            "roles_to_train": ["gpt"],  # ShareGPT's name for the assistant: what conversations train on
        },
        # What has no counterpart is named, not dropped unsaid: a percentage of a split, trained users' turns.
        {
            "path": "data/more.jsonl",
            "type": "chat_template",
            "split": "train[:20%]",
            "roles_to_train": ["user", "assistant"],
        },
    ]
    found = refused(client, body)
    assert found["chat_template"] == (
        'unknown key: conversations ("preset": "messages", "sharegpt") are rendered with the model\'s own '
        "chat template (its tokenizer_config.json's, or a chat_template.jinja beside it: put one there to "
        "choose another); other presets' prompts are data.prompt_template; there is no setting naming a "
        "template",
        "remove it",
    )
    fix = found["datasets"][1]
    assert fix == (
        'give its sources as "data": {"train": [{"path": "data/chat.jsonl", "preset": "messages"}, '
        '{"path": "data/alpaca.jsonl", "preset": "alpaca", "max_samples": 1000}, {"path": '
        '"data/sharegpt.jsonl", "preset": "messages", "fields": {"messages": "conversations"}, "split": '
        '"validation"}, {"path": "data/more.jsonl", "preset": "messages"}]} (Axolotl\'s "type" is the '
        '"preset"; "chat_template" is "messages"), and remove it; not carried: "split": "train[:20%]" of '
        '"data/more.jsonl" (a source reads a whole split; "max_samples": N keeps its first N rows); '
        '"roles_to_train": ["user", "assistant"] of "data/more.jsonl" (conversations are trained on the '
        "assistant's turns only)"
    )
    # A format spelled out field by field has no preset to name: the general fix, with no made-up value.
    body["datasets"] = [{"path": "data/a.jsonl", "type": {"field_instruction": "q", "field_output": "a"}}]
    assert refused(client, body)["datasets"][1] == (
        'give its sources as "data": {"train": [{"path": ..., "preset": ...}]} (Axolotl\'s "type" is the '
        '"preset"), and remove it'
    )
    assert client.get("/jobs", headers=USER).json()["count"] == 0
    # Followed as written: the sources taken from the fix's own text, `datasets` removed.
    fixed = recipe()
    fixed["data"] = json.loads(fix[fix.index("{") : fix.index("]}") + 2])
    accepted = client.post("/jobs", json=fixed, headers=USER)
    assert accepted.status_code == 201, accepted.text
    sources = accepted.json()["recipe"]["data"]["train"]
    assert [(s["preset"], s.get("fields"), s.get("split"), s.get("max_samples")) for s in sources] == [
        ("messages", None, None, None),
        ("alpaca", None, None, 1000),
        ("messages", {"messages": "conversations"}, "validation", None),
        ("messages", None, None, None),
    ]


def test_trls_script_arguments_get_their_places_and_use_peft_false_is_a_full_fine_tune(
    client: TestClient,
) -> None:
    # `trl sft --config`'s keys: the dataset as a Hub id and its text column, LoRA switched by `use_peft`
    # (the recipe trains LoRA unless "adapter" is null), metrics sent by `report_to`.
    body = recipe(dataset_name="trl-lib/Capybara", dataset_text_field="content", use_peft=False)
    body["report_to"] = "none"
    found = refused(client, body)
    assert set(found) == {"dataset_name", "dataset_text_field", "use_peft", "report_to"}
    assert found["dataset_name"][1].startswith('give it as "data": {"train": [{"path": ...}]} (the Hub id')
    # A text column alone is masked_lm's; a causal_lm recipe trains on answers.
    assert found["dataset_text_field"][1].startswith(
        'a causal_lm recipe trains on answers, not plain text: map each source\'s columns as "fields": '
        '{"question": ..., "answer": ...}'
    )
    assert found["use_peft"][1].endswith('where it was false, set "adapter": null for a full fine-tune')
    assert found["report_to"] == (
        "unknown key: every step's metrics go to Flightdeck (flightdeck watch, GET /jobs/<id>/metrics); "
        "there is no setting for it",
        "remove it",
    )
    fixed = recipe(adapter=None)
    fixed["data"]["train"] = [{"path": "trl-lib/Capybara", "preset": "messages"}]
    accepted = client.post("/jobs", json=fixed, headers=USER)
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["effective_recipe"]["adapter"] is None


def test_an_environment_value_given_unquoted_gets_the_text_it_stands_for(client: TestClient) -> None:
    # As YAML and Compose users write them. A boolean is "1"/"0", which NCCL's switches read (they parse an
    # integer: "true" would leave P2P on) and the bool words take too. No fix where the text would still be
    # refused: a boolean thread count, a name not allowed.
    env = {"OMP_NUM_THREADS": 4, "TOKENIZERS_PARALLELISM": False, "NCCL_P2P_DISABLE": True}
    answer = client.post("/jobs", json=recipe(env=env | {"MKL_NUM_THREADS": True, "HOME2": 3}), headers=USER)
    assert answer.status_code == 422
    found = {f["path"]: (f["message"], f["fix"]) for f in answer.json()["findings"]}
    assert found == {
        "env.OMP_NUM_THREADS": (
            "must be text: an environment holds only strings; got 4",
            'give it as text: "OMP_NUM_THREADS": "4"',
        ),
        "env.TOKENIZERS_PARALLELISM": (
            "must be text: an environment holds only strings; got False",
            'give it as text: "TOKENIZERS_PARALLELISM": "0"',
        ),
        "env.NCCL_P2P_DISABLE": (
            "must be text: an environment holds only strings; got True",
            'give it as text: "NCCL_P2P_DISABLE": "1"',
        ),
        "env.MKL_NUM_THREADS": ("must be a valid string; got True", None),
        "env.HOME2": ("must be a valid string; got 3", None),
    }
    fixed = {"OMP_NUM_THREADS": "4", "TOKENIZERS_PARALLELISM": "0", "NCCL_P2P_DISABLE": "1"}
    accepted = client.post("/jobs", json=recipe(env=fixed), headers=USER)
    assert accepted.status_code == 201, accepted.text


def test_peft_s_saved_adapter_config_as_the_adapter_gets_one_finding_with_the_adapter_it_stands_for(
    client: TestClient, tmp_path: Path
) -> None:
    # As peft writes it (save_pretrained: 41 fields in peft 0.21), pasted in as the adapter. Written by the
    # installed peft, so a field a new peft adds with a default that is not "off" fails here.
    from peft import LoraConfig

    def saved(name: str, **settings: Any) -> dict[str, Any]:
        LoraConfig(task_type="CAUSAL_LM", **settings).save_pretrained(str(tmp_path / name))
        return dict(json.loads((tmp_path / name / "adapter_config.json").read_text()))

    plain = saved("plain", r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])
    dora = saved("dora", r=4, target_modules=["q_proj"], use_dora=True, modules_to_save=["lm_head"])
    body = recipe(adapter=plain)
    body["stages"] = [{"adapter": dora}]
    found = refused(client, body)
    assert found == {
        "adapter": (
            "this is peft's saved adapter_config.json (a LoraConfig); the recipe's adapter takes its settings "
            "by the recipe's names",
            'give it as "adapter": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}',
        ),
        "stages[0].adapter": (
            "this is peft's saved adapter_config.json (a LoraConfig); the recipe's adapter takes its settings "
            "by the recipe's names; these of its settings have no place in the recipe and would not apply: "
            "use_dora true",
            'give it as "adapter": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"], '
            '"modules_to_save": ["lm_head"]}',
        ),
    }
    fixed = recipe(adapter={"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]})
    accepted = client.post("/jobs", json=fixed, headers=USER)
    assert accepted.status_code == 201, accepted.text


def test_a_key_of_an_object_inside_a_section_given_in_the_section_is_pointed_into_it(
    client: TestClient,
) -> None:
    # A data source written as `data` itself, Slurm's partition in `resources`: the keys of what the section
    # holds. A one-word key is not moved to another section on its name alone: `path` in `training` is no
    # model.path.
    body = recipe(data={"path": "data/a.jsonl", "preset": "alpaca"}, resources={"partition": "gpu"})
    body["training"]["path"] = "x"
    # At the top level too, `path` may be the model's or a source's; `seed` can only be training's; caps
    # lock on is a typo.
    body |= {"path": "data/b.jsonl", "TRAINING": {"seed": 3}, "max_samples": 100}
    body["model"]["seed"] = 3
    unknown = ("unknown key; remove it or fix its spelling (see GET /recipes/schema)", None)
    assert refused(client, body) == {
        "data.path": (
            "unknown key in 'data'; 'path' is a key of each entry of 'data.train'",
            'move \'path\' into each entry: "data": {"train": [{"path": ...}]}',
        ),
        "data.preset": (
            "unknown key in 'data'; 'preset' is a key of each entry of 'data.train'",
            'move \'preset\' into each entry: "data": {"train": [{"preset": ...}]}',
        ),
        "data.train": ("required; add this field", None),
        "resources.partition": (
            "unknown key in 'resources'; 'partition' belongs in 'resources.slurm'",
            "move 'partition' into 'resources.slurm'",
        ),
        "training.path": unknown,
        "path": unknown,
        "model.seed": (
            "unknown key in 'model'; 'seed' belongs in 'training' ('training.seed')",
            "move 'seed' into 'training'",
        ),
        "TRAINING": (
            "unknown key; did you mean 'training'? (the keys allowed here: GET /recipes/schema)",
            "rename 'TRAINING' to 'training'",
        ),
        # Flat, a key of what a section holds (LLaMA-Factory's max_samples): pointed in, not lost.
        "max_samples": (
            "unknown key at the top level; 'max_samples' is a key of each entry of 'data.train'",
            'move \'max_samples\' into each entry: "data": {"train": [{"max_samples": ...}]}',
        ),
    }


def test_llama_factorys_names_get_their_places(client: TestClient) -> None:
    # A LLaMA-Factory training YAML's own keys, flat at the top level as it writes them.
    body = recipe(finetuning_type="full", lora_rank=8, lora_target="all", cutoff_len=2048, quantization_bit=4)
    body["dataset"] = "identity,alpaca_en_demo"  # entries of its dataset_info.json
    body |= {"template": "qwen3_nothink", "dataset_dir": "data"}  # its chat format's name, that file's folder
    answer = client.post("/jobs", json=body, headers=USER)
    assert answer.status_code == 422
    findings = answer.json()["findings"]
    # Said why there is nothing to set, so that "remove it" does not read as dropping what the run needs.
    messages = {f["path"]: f["message"] for f in findings}
    assert messages["template"].startswith(
        'unknown key: conversations ("preset": "messages", "sharegpt") are rendered with the model\'s own '
        "chat template"
    )
    assert messages["dataset_dir"].startswith('unknown key: each source\'s "path" names its file')
    found = {f["path"]: f["fix"] for f in findings if f["path"] not in ("template", "dataset_dir")}
    assert {f["fix"] for f in findings if f["path"] in ("template", "dataset_dir")} == {"remove it"}
    assert found == {
        "finetuning_type": 'remove it where it was "lora" ("adapter" is LoRA by default; its lora_* keys go '
        'in it); for "full" set "adapter": null; for "freeze", "adapter": null and model.freeze naming the '
        "parts that stay frozen",
        "lora_rank": "move 'lora_rank' into 'adapter' as 'r'",
        "lora_target": 'in \'adapter\': give it as "target_modules": a list of module names (["q_proj", '
        '"v_proj"] for "q_proj,v_proj"), or "all-linear" for "all"',
        "cutoff_len": "move 'cutoff_len' into 'data' as 'max_seq_length'",
        "quantization_bit": 'in \'model\': replace it with "quantization": "4bit" for 4, "8bit" for 8',
        "dataset": 'give its sources as "data": {"train": [{"path": ..., "preset": ...}]}, one per name: '
        "LLaMA-Factory's names are entries of dataset_info.json in its dataset_dir, each one's "
        '"file_name" the "path" and its "formatting" the "preset" ("alpaca" where it names none); and '
        "remove it",
    }


def test_trainingarguments_written_out_as_training_gets_no_rename_to_another_setting(
    client: TestClient,
) -> None:
    # Every field of a real TrainingArguments (to_dict: 110-odd), as a config dumped from one has them. A
    # close name is no typo: renaming per_device_eval_batch_size to per_device_batch_size would change the
    # training batch size, and eval_strategy "no" is no eval_steps.
    from transformers import TrainingArguments

    arguments = TrainingArguments(
        output_dir="out", per_device_train_batch_size=4, num_train_epochs=2, report_to="none"
    )
    answer = client.post("/jobs", json=recipe(training=arguments.to_dict()), headers=USER)
    assert answer.status_code == 422
    found = {f["path"]: (f["message"], f["fix"]) for f in answer.json()["findings"]}
    renames = {path: fix for path, (_, fix) in found.items() if fix and fix.startswith("rename")}
    # transformers 5's default optimizer on torch 2.8 and later is the fused AdamW: the recipe's adamw_torch.
    optim = str(getattr(arguments.optim, "value", arguments.optim))
    same_adamw = (
        ', its value as "adamw_torch" (the same AdamW update)' if optim == "adamw_torch_fused" else ""
    )
    assert optim in ("adamw_torch", "adamw_torch_fused")
    assert renames == {
        "training.per_device_train_batch_size": "rename 'per_device_train_batch_size' to 'per_device_batch_size'",
        "training.num_train_epochs": "rename 'num_train_epochs' to 'epochs'",
        "training.lr_scheduler_type": "rename 'lr_scheduler_type' to 'lr_scheduler'",
        "training.optim": "rename 'optim' to 'optimizer'" + same_adamw,
    }
    for other in ("per_device_eval_batch_size", "eval_strategy", "logging_strategy", "save_strategy"):
        assert found[f"training.{other}"] == (
            "unknown key; remove it or fix its spelling (see GET /recipes/schema)",
            None,
        )
    # Another section's keys, by the recipe's name or TrainingArguments'.
    assert found["training.gradient_checkpointing"] == (
        "unknown key in 'training'; 'gradient_checkpointing' belongs in 'model' ('model.gradient_checkpointing')",
        "move 'gradient_checkpointing' into 'model'",
    )
    assert (
        found["training.dataloader_num_workers"][1]
        == "move 'dataloader_num_workers' into 'data' as 'num_workers'"
    )
    # TrainingArguments' "not set": -1 steps, null for "decide for me".
    assert found["training.max_steps"][1] == (
        "remove it: -1 is how other tools say 'not set', and without it the default applies (no limit: "
        "training.epochs decides)"
    )
    assert found["training.ddp_find_unused_parameters"][1] == (
        "remove it: null is how other tools say 'not set', and without it the default applies (false)"
    )
    # A typo is still one.
    typo = recipe(training={"learning_rat": 1e-4}, data={"max_seq_len": 256}, max_steps=-1)
    # In a stage, a key is moved only where a stage may set it: not into the launch's `resources`; and
    # what is left out of a stage is the top level's.
    typo["stages"] = [{"training": {"nproc_per_node": 2, "lora_r": 4, "max_steps": -1}}]
    found = {f["path"]: f["fix"] for f in client.post("/jobs", json=typo, headers=USER).json()["findings"]}
    assert found == {
        "training.learning_rat": "rename 'learning_rat' to 'learning_rate'",
        "data.max_seq_len": "rename 'max_seq_len' to 'max_seq_length'",
        "data.train": None,
        # Flat, and "not set": removed, not moved as it is.
        "max_steps": "remove it: -1 is how other tools say 'not set', and without it the default applies "
        "(no limit: training.epochs decides)",
        "stages[0].training.nproc_per_node": None,
        "stages[0].training.lora_r": "move 'lora_r' into 'adapter' as 'r'",
        "stages[0].training.max_steps": "remove it: -1 is how other tools say 'not set', and without it the "
        "top level's value applies (or the default: no limit: training.epochs decides)",
    }


def test_a_section_given_as_one_value_gets_the_object_it_stands_for(client: TestClient) -> None:
    cases = [
        ("data", "data/a.jsonl", 'give it as "data": {"train": [{"path": "data/a.jsonl"}]}'),
        ("data", [{"path": "data/a.jsonl"}], 'give the list as "data": {"train": [...]}, each source a "path" '
         'and its "preset"'),
        ("adapter", "full", 'for a full fine-tune set "adapter": null'),
        ("adapter", "IA3", 'Flightdeck trains LoRA adapters ("adapter": {} for the defaults) or, with "adapter": '
         "null, every weight model.freeze leaves trainable; for another method than 'IA3', run your own "
         "script as a script job (docs/own-script.md)"),
        ("training", 3, None),
    ]  # fmt: skip
    lora = 'give LoRA\'s settings as an object: "adapter": {} takes the defaults'
    cases += [("adapter", word, lora) for word in ("LoRA", True)]
    for section, value, fix in cases:
        answer = client.post("/jobs", json=recipe(**{section: value}), headers=USER)
        assert answer.status_code == 422
        (finding,) = answer.json()["findings"]
        assert finding["path"] == section
        assert finding["fix"] == fix or (fix == lora and finding["fix"].startswith(lora)), finding["fix"]
        # pydantic's class name ('DataSpec') is nothing the user wrote.
        assert (
            finding["message"].startswith("must be an object of settings")
            and "Spec" not in finding["message"]
        )
    # In a stage the object is merged over the top level's: {} keeps its r 4, not the defaults.
    body = recipe(adapter={"r": 4})
    body["stages"] = [{"adapter": "lora"}]
    assert refused(client, body)["stages[0].adapter"][1] == (
        "give LoRA's settings as an object: \"adapter\": {} keeps the top level's adapter settings (the "
        'defaults where it sets none: r 16, alpha 32, target_modules ["q_proj", "v_proj"]), or set "r", '
        '"alpha" and "target_modules" in it'
    )
    body["stages"] = [{"adapter": {}}]
    accepted = client.post("/jobs", json=body, headers=USER)
    assert accepted.status_code == 201, accepted.text
    (stage,) = expand_stages(parse_recipe(accepted.json()["effective_recipe"]))
    assert stage.adapter is not None and stage.adapter.r == 4  # what the stage trains with


def test_a_key_of_another_tool_whose_value_changes_gets_the_new_value_not_a_rename(
    client: TestClient,
) -> None:
    # Renamed as they are, these would be `warmup_ratio: 100` (a fraction below 1) and `precision: true`.
    body = recipe()
    body["training"] |= {"warmup_steps": 100, "bf16": True}
    body["model"] |= {"load_in_4bit": True}
    found = refused(client, body)
    assert "did you mean 'warmup_ratio'" in found["training.warmup_steps"][0]
    assert "fraction of the run's steps" in found["training.warmup_steps"][1]
    assert "rename" not in found["training.warmup_steps"][1]
    assert found["training.bf16"][1].startswith('replace it with "precision": "bf16"')
    assert found["model.load_in_4bit"][1].startswith('replace it with "quantization": "4bit"')


def test_bad_bodies_get_a_clear_4xx(client: TestClient) -> None:
    cases = [
        (b"{not json", "application/json", 400),
        (b"", "application/json", 400),
        (b"[1, 2]", "application/json", 422),
        (b"name=x", "application/x-www-form-urlencoded", 415),
        (
            b'{"name": "x", "model": {"path": "m"}, "data": {"train": [{"path": "d"}]}, '
            b'"training": {"max_steps": 1e400}}',
            "application/json",
            400,
        ),
        (
            b'{"name": "x", "model": {"path": "m"}, "data": {"train": [{"path": "d"}]}, '
            b'"training": {"seed": 123456789012345678901234567890}}',
            "application/json",
            422,
        ),
    ]
    for body, content_type, expected in cases:
        answer = client.post("/jobs", content=body, headers=USER | {"content-type": content_type})
        assert answer.status_code == expected, (body, answer.text)
        assert answer.json()["detail"]
    assert client.get("/jobs", headers=USER).json()["count"] == 0


def test_oversized_body_is_refused(client: TestClient) -> None:
    huge = recipe(name="x" * 100)
    huge["data"]["prompt_template"] = "y" * (9 * 1024 * 1024)
    answer = client.post("/jobs", json=huge, headers=USER)
    assert answer.status_code == 413
    assert "larger than" in answer.json()["detail"]


def test_unicode_and_hostile_names_are_stored_verbatim(client: TestClient) -> None:
    for name in ["Ünïcødé 模型 🚀", "<script>alert('x')</script>", 'a"; $(rm -rf /) `id`\nnext']:
        answer = client.post("/jobs", json=recipe(name=name), headers=USER)
        assert answer.status_code == 201
        assert client.get(f"/jobs/{answer.json()['id']}", headers=USER).json()["name"] == name


def test_list_is_newest_first_with_status_filter_and_cursor(client: TestClient) -> None:
    ids = [client.post("/jobs", json=recipe(name=f"j{i}"), headers=USER).json()["id"] for i in range(5)]
    client.post(f"/jobs/{ids[1]}/cancel", headers=USER)
    first = client.get("/jobs?limit=2", headers=USER).json()
    assert [j["id"] for j in first["data"]] == [ids[4], ids[3]]
    second = client.get(f"/jobs?limit=2&cursor={first['next_cursor']}", headers=USER).json()
    assert [j["id"] for j in second["data"]] == [ids[2], ids[1]]
    last = client.get(f"/jobs?limit=2&cursor={second['next_cursor']}", headers=USER).json()
    assert [j["id"] for j in last["data"]] == [ids[0]] and last["next_cursor"] is None
    cancelled = client.get("/jobs?status=cancelled", headers=USER).json()
    assert [j["id"] for j in cancelled["data"]] == [ids[1]]
    assert client.get("/jobs?status=bogus", headers=USER).status_code == 422


def test_cancel_queued_then_terminal_refuses_change(client: TestClient) -> None:
    job_id = client.post("/jobs", json=recipe(), headers=USER).json()["id"]
    answer = client.post(f"/jobs/{job_id}/cancel", headers=USER)
    assert answer.status_code == 202 and answer.json()["status"] == "cancelled"
    again = client.post(f"/jobs/{job_id}/cancel", headers=USER)
    assert again.status_code == 409 and "terminal" in again.json()["detail"]
    assert client.post("/jobs/999/cancel", headers=USER).status_code == 404


def test_missing_job_is_404(client: TestClient) -> None:
    for path in ["/jobs/42", "/jobs/42/metrics", "/jobs/42/logs", "/jobs/42/events"]:
        assert client.get(path, headers=USER).status_code == 404, path


def test_schema_and_health_need_no_token(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    schema = client.get("/recipes/schema").json()
    assert schema["title"] == "Flightdeck recipe" and schema["required"] == ["name"]
    # A recipe job needs model and data; a script job needs an entrypoint instead.
    assert {"required": ["model", "data"]} in schema["anyOf"]


def test_preflight_dry_run_with_a_described_host(client: TestClient) -> None:
    host = {
        "hostname": "h",
        "gpus": [
            {"index": i, "name": "NVIDIA A100", "memory_mb": 40960, "compute_capability": "8.0"}
            for i in range(8)
        ],
        "cores": 32,
        "workspace": "/ws",
        "runs_dir": "/ws/runs",
    }
    body = {"recipe": recipe(), "host": host, "model_config": LLAMA2_7B}
    answer = client.post("/preflight", json=body, headers=USER)
    assert answer.status_code == 200, answer.text
    dry = answer.json()
    assert dry["ok"] is True
    assert "flightdeck.worker.train" in dry["plan"]["argv"]
    assert {v["name"] for v in dry["plan"]["env"]} >= {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}
    assert 5 < dry["memory"][0]["total_gb"] < 40
    assert client.get("/jobs", headers=USER).json()["count"] == 0


def test_preflight_reports_host_errors_without_storing(client: TestClient) -> None:
    small = {"hostname": "h", "cpu_slots": 1, "cores": 2, "workspace": "/ws", "runs_dir": "/ws/runs"}
    answer = client.post("/preflight", json={"recipe": recipe(), "host": small}, headers=USER)
    assert answer.status_code == 200
    assert answer.json()["ok"] is False
    assert "P004" in {f["code"] for f in answer.json()["findings"]}
    refused = client.post("/preflight", json=recipe(env={"RANK": "1"}), headers=USER)
    assert refused.status_code == 422 and refused.json()["findings"][0]["code"] == "E006"
    assert client.get("/jobs", headers=USER).json()["count"] == 0


def test_worker_token_cannot_use_user_routes(client: TestClient) -> None:
    assert client.post("/jobs", json=recipe(), headers=WORKER).status_code == 403
    assert client.get("/jobs", headers=WORKER).status_code == 403


def test_oversized_streamed_body_without_length_is_413(client: TestClient) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(10):
            yield b" " * (1024 * 1024)

    for url, headers in [("/jobs", USER), ("/workers/1/heartbeat", WORKER)]:
        answer = client.post(url, content=chunks(), headers=headers | {"content-type": "application/json"})
        assert answer.status_code == 413, (url, answer.text)


def test_a_recipe_over_the_size_limit_is_refused_with_413_naming_it(client: TestClient) -> None:
    huge = recipe(name="big") | {"data": {"train": [{"path": "x" * 4000}] * 80}}
    for route in ("/jobs", "/preflight"):
        answer = client.post(route, json=huge, headers=USER)
        assert answer.status_code == 413, (route, answer.text)
        assert "FLIGHTDECK_MAX_RECIPE_BYTES" in answer.json()["detail"]
    assert client.get("/jobs", headers=USER).json()["data"] == []  # nothing stored


def test_job_lists_carry_summaries_and_the_detail_carries_the_recipes(client: TestClient) -> None:
    job_id = client.post("/jobs", json=recipe(name="listed"), headers=USER).json()["id"]
    (row,) = client.get("/jobs", headers=USER).json()["data"]
    assert row["id"] == job_id and row["name"] == "listed" and row["findings_count"] >= 1
    assert not {"recipe", "effective_recipe", "findings"} & set(row)
    detail = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert detail["recipe"]["name"] == "listed" and detail["effective_recipe"]
