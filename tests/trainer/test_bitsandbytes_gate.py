"""A recipe rank leaves bitsandbytes unimported unless the run can call it (worker/train/bitsandbytes_gate.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flightdeck.recipe import expand_stages, parse_recipe
from flightdeck.worker.train.bitsandbytes_gate import bitsandbytes_use

REPO = Path(__file__).resolve().parents[2]


def _use(make_recipe, workspace: Path, **parts: Any) -> str | None:  # type: ignore[no-untyped-def]
    return bitsandbytes_use(expand_stages(parse_recipe(make_recipe(**parts))), workspace)


def _copy_model(workspace: Path, tmp_path: Path, **config_extra: Any) -> Path:
    """The tiny model's config.json (as transformers wrote it), with `config_extra` merged in."""
    model = tmp_path / "model"
    model.mkdir()
    config = json.loads((workspace / "models/tiny-llama/config.json").read_text()) | config_extra
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_lora_recipe_on_a_plain_checkpoint_uses_no_bitsandbytes(make_recipe, workspace: Path) -> None:
    assert _use(make_recipe, workspace) is None


def test_quantization_in_any_stage_and_8bit_optimizers_use_it(make_recipe, workspace: Path) -> None:
    later_stage_quantizes = _use(
        make_recipe, workspace, stages=[{}, {"model": {"path": "@previous", "quantization": "4bit"}}]
    )
    assert later_stage_quantizes == "model.quantization 4bit"
    for optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        assert (
            _use(make_recipe, workspace, training={"optimizer": optimizer})
            == f"training.optimizer {optimizer}"
        )
    assert _use(make_recipe, workspace, training={"optimizer": "adafactor"}) is None


def test_a_checkpoint_saved_quantised_uses_it(make_recipe, workspace: Path, tmp_path: Path) -> None:
    """A model saved after a 4-bit load (save_pretrained writes the BitsAndBytesConfig into config.json,
    as quantised checkpoints on the Hub have it) loads through bitsandbytes with no quantization asked."""
    from transformers import BitsAndBytesConfig

    saved = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4").to_dict()
    model = _copy_model(workspace, tmp_path, quantization_config=saved)
    reason = _use(make_recipe, workspace, model={"path": str(model)})
    assert reason is not None and "quant_method bitsandbytes" in reason and str(model) in reason


def test_a_config_it_cannot_read_keeps_it_importable(make_recipe, workspace: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    assert "not readable" in (_use(make_recipe, workspace, model={"path": str(model)}) or "")


def _hub_cache(cache: Path, repo: str, config: dict[str, Any]) -> None:
    """huggingface_hub's cache layout: refs/main names the snapshot that holds the files."""
    root = cache / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    (root / "snapshots" / commit).mkdir(parents=True)
    (root / "snapshots" / commit / "config.json").write_text(json.dumps(config))


def test_a_hub_model_is_judged_by_its_cached_config(
    make_recipe, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    plain = json.loads((workspace / "models/tiny-llama/config.json").read_text())
    _hub_cache(tmp_path / "hub", "org/plain", plain)
    _hub_cache(tmp_path / "hub", "org/nf4", plain | {"quantization_config": {"quant_method": "bitsandbytes"}})
    assert _use(make_recipe, workspace, model={"path": "org/plain"}) is None
    assert "quant_method bitsandbytes" in (_use(make_recipe, workspace, model={"path": "org/nf4"}) or "")
    # Not in the cache: the gate cannot tell, so bitsandbytes stays (loading then fails on its own terms).
    assert "not in the local hub cache" in (_use(make_recipe, workspace, model={"path": "org/absent"}) or "")


_GATE = """
import sys
from pathlib import Path
from flightdeck.worker.train.bitsandbytes_gate import keep_bitsandbytes_out_unless_used
kept_out = keep_bitsandbytes_out_unless_used(Path(sys.argv[1]))
import peft, transformers.trainer_utils
import transformers.utils.import_utils as available
print(kept_out, "bitsandbytes" in sys.modules and sys.modules["bitsandbytes"] is not None,
      available.is_bitsandbytes_available())
"""


@pytest.mark.slow  # two fresh interpreters importing transformers and peft
@pytest.mark.parametrize(
    ("parts", "expected"),
    [({}, "True False False"), ({"model": {"quantization": "4bit"}}, "False True True")],
    ids=["lora", "qlora"],
)
def test_in_a_fresh_process_peft_and_transformers_see_the_gates_decision(
    make_recipe, workspace: Path, tmp_path: Path, parts: dict[str, Any], expected: str
) -> None:
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(make_recipe(**parts)))
    done = subprocess.run(
        [sys.executable, "-c", _GATE, str(recipe)],
        cwd=REPO,
        env={**os.environ, "FLIGHTDECK_WORKSPACE": str(workspace)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == expected, done.stdout


@pytest.mark.slow  # a real torchrun rank and its spawned loader worker
def test_a_lora_rank_and_its_loader_worker_train_without_bitsandbytes_or_the_trainer_module(
    run_trainer, make_recipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rank keeps bitsandbytes out; its spawned DataLoader worker, seeded from worker/train/loader_seed.py,
    imports neither transformers' trainer module nor (through it) peft and bitsandbytes."""
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # every import of the rank and its worker, on stderr
    recipe = make_recipe(training={"max_steps": 2}, data={"num_workers": 1})
    outcome = run_trainer(recipe, nproc=1)
    assert outcome.returncode == 0, outcome.describe()
    assert len(outcome.steps) == 2
    imported = [
        line.split("|")[-1].strip() for line in outcome.output.splitlines() if line.startswith("import time:")
    ]
    # A spawned worker imports the loop it runs by name (the rank, nested, imports it too).
    assert "torch.utils.data._utils.worker" in imported, "the loader worker's imports were not seen"
    # peft's `import bitsandbytes` is tried and refused (one line, no module); a real import loads its parts.
    assert not [name for name in imported if name.startswith("bitsandbytes.")], "bitsandbytes was imported"
    # Once, by the rank; a worker unpickling transformers' seed_worker would import it a second time.
    assert imported.count("transformers.trainer_utils") == 1
