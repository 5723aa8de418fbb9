"""`flightdeck preflight` runs the worker's own host check here when the recipe's files are at hand, and
says by name which checks did not run when they are not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flightdeck.cli.main import app
from tests.cli.live_service import USER_TOKEN, LiveService, live_service, minimal_recipe


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """One service for the module: these tests only ask it for dry runs."""
    with live_service(tmp_path_factory.mktemp("local-preflight-data")) as running:
        yield running


@pytest.fixture
def workspace(tiny_workspace: Path) -> Path:
    """models/tiny-llama (save_pretrained) and data/qa.jsonl, as a worker's workspace holds them."""
    return tiny_workspace


def _recipe(tmp_path: Path, **overrides: Any) -> Path:
    recipe = minimal_recipe() | {
        "model": {"path": "models/tiny-llama"},
        "data": {"train": [{"path": "data/qa.jsonl"}], "max_seq_length": 64},
        "adapter": {"type": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "training": {"max_steps": 4, "per_device_batch_size": 2, "gradient_accumulation_steps": 1},
        "resources": {"accelerator": "any", "gpus_per_node": 2},
    }
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe | overrides))
    return path


def _preflight(runner: CliRunner, service: LiveService, *args: str) -> Any:
    return runner.invoke(app, ["preflight", *args, "--url", service.url, "--token", USER_TOKEN])


BROKEN = {
    "D001": {"data": {"train": [{"path": "data/qa.jsonl", "fields": {"question": "prompt"}}]}},
    "G006": {"adapter": {"type": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "qq_proj"]}},
    "P008": {"model": {"path": "models/tiny-lama"}},
}


def test_local_preflight_fails_each_broken_recipe_with_its_code(
    runner: CliRunner, service: LiveService, workspace: Path, tmp_path: Path
) -> None:
    """Wrong dataset fields, a LoRA target the model lacks, a model path that names nothing."""
    for code, broken in BROKEN.items():
        result = _preflight(runner, service, str(_recipe(tmp_path, **broken)), "--workspace", str(workspace))
        assert result.exit_code == 1, (code, result.output)
        assert code in result.output and "preflight found errors" in result.output, (code, result.output)
        assert "preflight passed" not in result.output


def test_local_preflight_defaults_to_the_current_directory_and_plans_for_this_host(
    runner: CliRunner, service: LiveService, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _recipe(tmp_path)
    monkeypatch.chdir(workspace)
    monkeypatch.setenv(
        "CUDA_VISIBLE_DEVICES", ""
    )  # this test machine's facts: no GPU (mocked where one exists)
    result = _preflight(runner, service, str(recipe))
    assert result.exit_code == 0, result.output
    assert "the worker's host checks, run here on" in result.output, result.output
    # The plan is for this host's facts (CPU, gloo), not a notional GPU worker (NCCL, 16 cores).
    assert "launch plan on this host" in result.output and "no GPU: 2 CPU slot(s)" in result.output
    assert "gloo" in result.output and "NCCL" not in result.output, result.output
    # config.json is local, so the memory estimate is shown, not "unknown".
    assert "memory estimate per GPU (GB)" in result.output, result.output

    broken = _recipe(tmp_path, model={"path": "models/tiny-lama"})
    assert _preflight(runner, service, str(broken)).exit_code == 1


def test_without_the_files_the_checks_that_did_not_run_are_named(
    runner: CliRunner, service: LiveService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # holds none of the recipe's paths
    result = _preflight(runner, service, str(_recipe(tmp_path, model={"path": "models/tiny-lama"})))
    assert result.exit_code == 0, result.output
    assert "preflight passed" not in result.output
    assert "not run here" in result.output and "static checks passed" in result.output
    for named in ("model path loads", "P008", "LoRA target modules", "G006", "field names", "D001"):
        assert named in result.output, (named, result.output)
    # The notional worker's plan says that it is one, and its facts.
    assert "a notional worker" in result.output and "GPU(s)" in result.output, result.output


def test_worker_checks_list_every_code_the_host_preflight_raises() -> None:
    import re

    from flightdeck.preflight.worker_checks import WORKER_CHECKS

    listed = {code for _, codes in WORKER_CHECKS for code in codes}
    sources = Path(__file__).resolve().parents[2] / "worker" / "host_preflight"
    raised = {m for f in sources.glob("*.py") for m in re.findall(r'"([A-Z]\d{3})"', f.read_text())}
    assert listed == raised
