"""`flightdeck preflight` of a script job whose HF arguments name a local model: the estimate is shown."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from flightdeck.memory.reference_models import LLAMA2_7B
from tests.cli.live_service import LiveService
from tests.cli.test_client_commands import recipe_file, run


def test_a_script_jobs_local_model_directory_gives_the_memory_estimate(
    runner: CliRunner, service: LiveService, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    (workspace / "models" / "llama-2-7b").mkdir(parents=True)
    (workspace / "models" / "llama-2-7b" / "config.json").write_text(json.dumps(LLAMA2_7B))
    (workspace / "user").mkdir()
    (workspace / "user" / "sft.py").write_text("import transformers\n")
    job = {
        "name": "sft",
        "entrypoint": {
            "script": "user/sft.py",
            "args": ["--model_name_or_path={workspace}/models/llama-2-7b", "--per_device_train_batch_size", "2",
                     "--bf16", "--output_dir", "{output_dir}"],
        },
        "resources": {"gpus_per_node": 1, "accelerator": "gpu"},
    }  # fmt: skip
    result = run(runner, service, "preflight", str(recipe_file(tmp_path, job)), "--workspace", str(workspace))
    # This host has no GPU: the one error is P004, the plan is for this host's CPU slots.
    assert result.exit_code == 1 and "P004" in result.output, result.output
    assert "llama-2-7b/config.json" in result.output
    assert "memory estimate per GPU (GB)" in result.output and "unknown" not in result.output
